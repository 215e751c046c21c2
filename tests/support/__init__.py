"""What the tests share: waiting on a condition, free ports, an ASGI app served in a thread, a Kafka topic
read to its end or followed, the stack as a user runs it, and the chaos harness. The benchmarks may import
from here; nothing here imports from bench/."""
