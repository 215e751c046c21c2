"""What the tests share: waiting on a condition, free ports, an ASGI app served in a thread, a Kafka topic
read to its end or followed, a live gateway, the capture proxy, the pool and its sink, the stack as a user
runs it, the chaos harness; builders of raw events (``events``) and complete records (``records``), the
stream processor without Kafka (``stream_harness``), a fake producer and a schema-registry stub. Tests and
benchmarks take their helpers from here, never from a test module or another folder's conftest; nothing
here imports from bench/."""
