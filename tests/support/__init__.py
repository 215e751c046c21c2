"""What the tests share: waiting on a condition, free ports, an ASGI app served in a thread, a Kafka topic
read to its end or followed, the stack as a user runs it, the chaos harness; builders of raw events
(``events``) and complete records (``records``), the stream processor without Kafka (``stream_harness``),
a fake producer and a schema-registry stub. Unit tests and benchmarks take their helpers from here, never
from a test module; nothing here imports from bench/."""
