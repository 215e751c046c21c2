"""Kafka curated topics -> the pool: batched, replay-safe writes (see docs/pool.md)."""
