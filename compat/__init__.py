"""The seed system's protocol (AgentR1/Claw-R1 ``claw_r1/gateway``) on one compat port.

Agents, rollout workers and reward calls written for the seed gateway switch over without edits:
per-trajectory base URLs for black-box agents (their calls go through the capture proxy), step
submission and token-id generation for white-box agents, and reward computation. See docs/compat.md.

models (the seed's JSON shapes) -> steps (pure mappings onto our records) -> app (routes), with
registry (per-trajectory registrations), relay (calls through the proxy) and engines (/generate).
"""
