"""Every error the consumer SDK raises, in one tree::

    ConsumerError                 catch-all for the SDK
    ├── UsageError (ValueError)   the call itself is wrong; retrying cannot help
    │   ├── InvalidSource         source URL/DSN the SDK cannot reach anything with
    │   ├── InvalidFilter         a curation filter with a bad name, type or value
    │   └── PresetNotFound        no saved preset by that name (also a LookupError)
    ├── ConsumerClosed            the consumer was used after close() (also a RuntimeError)
    ├── TransportError            talking to the pool failed
    │   ├── PoolUnavailable       no answer: connection refused, timed out, reset
    │   └── PoolRequestError      the pool answered with an error (HTTP status, ClickHouse code)
    ├── DataError (ValueError)    a step's data cannot become training arrays (e.g. logprob count)
    └── MissingDependency         an optional package is absent, e.g. torch (also an ImportError)

Errors of the libraries underneath (httpx, clickhouse-connect, the pool store) are translated
where the SDK calls them, so a trainer needs to know only this module; the original error stays
reachable as ``__cause__``.
"""

from __future__ import annotations

__all__ = [
    "ConsumerClosed",
    "ConsumerError",
    "DataError",
    "InvalidFilter",
    "InvalidSource",
    "MissingDependency",
    "PoolRequestError",
    "PoolUnavailable",
    "PresetNotFound",
    "TransportError",
    "UsageError",
]


class ConsumerError(Exception):
    """Base class of every error the consumer SDK raises."""


class UsageError(ConsumerError, ValueError):
    """The call is wrong as made (bad argument, wrong order of calls)."""


class InvalidSource(UsageError):
    """The source is neither a Claw-R1 API URL nor a ClickHouse DSN the SDK understands."""


class InvalidFilter(UsageError):
    """A curation filter has an unknown name, a wrong type or a value outside its vocabulary."""


class PresetNotFound(UsageError, LookupError):
    """No curation preset is saved in the pool under the given name."""


class ConsumerClosed(ConsumerError, RuntimeError):
    """The consumer was used after ``close()``."""


class TransportError(ConsumerError):
    """Talking to the pool failed."""


class PoolUnavailable(TransportError):
    """The pool did not answer (connection refused, timeout, closed connection)."""


class PoolRequestError(TransportError):
    """The pool answered, with an error: ``status`` is the HTTP status, ``code`` the ClickHouse code."""

    def __init__(self, message: str, status: int | None = None, code: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class DataError(ConsumerError, ValueError):
    """A step's stored data cannot be turned into training arrays as asked."""


class MissingDependency(ConsumerError, ImportError):
    """An optional package the call needs is not installed."""
