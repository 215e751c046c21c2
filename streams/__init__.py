"""Stream processors: raw captured events -> normalized, reward-joined, versioned steps.

Entry point: ``clawr1.streams.worker.run_worker(settings, ready)``; the flow is drawn in
``clawr1.streams.app`` and described in docs/streams.md.
"""
