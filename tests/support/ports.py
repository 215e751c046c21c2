"""Free loopback ports for the servers and brokers the tests (and the benchmarks) start."""

from __future__ import annotations

import contextlib
import random
import socket


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# Below Linux's ephemeral range (32768-60999 by default), where no outgoing connection takes a port.
_LISTEN_RANGE = (20_000, 32_000)


def free_ports(count: int) -> int:
    """The first of ``count`` consecutive free loopback ports for a local Kafka cluster's brokers, with
    the ``count`` after them free too (``clawr1 up`` puts the controllers there). Taken below the
    ephemeral range: a client's outgoing connection landing on a controller port between this check
    and the broker's start killed that broker on a busy machine (the controller could not bind)."""
    while True:
        first = random.randrange(_LISTEN_RANGE[0], _LISTEN_RANGE[1] - 2 * count)
        with contextlib.ExitStack() as held:
            try:
                for port in range(first, first + 2 * count):
                    held.enter_context(socket.socket()).bind(("127.0.0.1", port))
            except OSError:
                continue
        return first
