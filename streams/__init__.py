"""Stream processors: raw captured events -> normalized, reward-joined, versioned steps.

Entry point: ``streams.worker.run_worker(settings, ready)``; the flow is drawn in
``streams.app`` and described in docs/streams.md.
"""
