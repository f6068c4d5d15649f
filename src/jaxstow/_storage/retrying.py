"""Requests to an object store tried again when they fail for a reason that passes, with exponential backoff.

What passes: throttling (``503 SlowDown``, ``429``), other ``5xx`` answers, a connection refused, reset or timed out,
a body that breaks off or ends before the bytes its answer promised (:class:`BrokenBody`), and one that fails the
checksum its answer gave. What does not: a missing object, a refused permission, any other ``4xx``. One
:class:`Retries` policy holds for every request jaxstow sends itself, reads and writes alike: ``attempts`` in all, and
before the k-th retry a random wait of up to ``backoff * 2 ** (k - 1)`` seconds (full jitter), at most
:data:`MAX_BACKOFF`. A request that still fails is a :class:`~jaxstow.errors.StorageError` naming the URL, the
operation, the attempts and the last failure: the storage failed, never the file.

>>> from jaxstow._storage.retrying import Retries
>>> answers = iter([ConnectionResetError(104, "Connection reset by peer"), b"data"])
>>> def request():
...     answer = next(answers)
...     if isinstance(answer, Exception):
...         raise answer
...     return answer
>>> Retries(attempts=3, backoff=0.0).call(request, url="s3://bucket/w.jxs", doing="reading bytes 0-3 (GetObject)")
b'data'
>>> def throttled():
...     raise ConnectionResetError(104, "Connection reset by peer")
>>> Retries(attempts=2, backoff=0.0).call(throttled, url="s3://bucket/w.jxs", doing="reading bytes 0-3 (GetObject)")
Traceback (most recent call last):
...
jaxstow.errors.StorageError: s3://bucket/w.jxs: the storage failed: reading bytes 0-3 (GetObject) failed 2 times (the last: ConnectionResetError: [Errno 104] Connection reset by peer); ...
"""

from __future__ import annotations

import errno
import http.client
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from jaxstow.errors import JaxstowError, StorageError

__all__ = [
    "DEFAULT_ATTEMPTS",
    "MAX_BACKOFF",
    "BrokenBody",
    "Retries",
    "configured_attempts",
    "error_code",
    "transient",
]

T = TypeVar("T")

#: Attempts in all of one request when neither the transfer settings nor the storage options say (botocore's own).
DEFAULT_ATTEMPTS = 5
#: The longest wait between two attempts, in seconds.
MAX_BACKOFF = 20.0

# Error codes and exception names of the failures that pass, in botocore, urllib3, aiohttp and fsspec.
_CODES = frozenset(
    {
        "SlowDown",  # botocore's standard retry mode's codes, and S3's own
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "RequestLimitExceeded",
        "BandwidthLimitExceeded",
        "TooManyRequestsException",
        "ProvisionedThroughputExceededException",
        "PriorRequestNotComplete",
        "ServiceUnavailable",
        "InternalError",
        "RequestTimeout",
        "RequestTimeoutException",
        "BadDigest",  # a request's body damaged on its way, found by the checksum it was sent with
        "XAmzContentSHA256Mismatch",
    }
)
_NAMES = frozenset(
    {
        "HTTPClientError",  # botocore: a connection closed, a read timed out, a body that broke off, ...
        "ConnectionError",  # botocore's own (a connection refused or timed out); the builtin is caught by type
        "IncompleteReadError",
        "ResponseParserError",  # an answer cut short in its XML
        "ProtocolError",  # urllib3
        "ReadTimeoutError",
        "ClientPayloadError",  # aiohttp
        "ClientConnectionError",
        "ServerTimeoutError",
        "FSTimeoutError",  # fsspec
        "FlexibleChecksumError",  # botocore: a body damaged on its way, found by the checksum its answer gave
    }
)
_ERRNOS = frozenset(
    {errno.EBUSY, errno.EAGAIN, errno.ETIMEDOUT, errno.ECONNRESET, errno.ECONNREFUSED, errno.ECONNABORTED, errno.EPIPE}
    | {getattr(errno, "EREMOTEIO", 121)}
)


class BrokenBody(ConnectionError):
    """An answer whose body ended, or broke off, after ``count`` of the ``promised`` bytes."""

    def __init__(self, count: int, promised: int, cause: BaseException | None = None) -> None:
        how = f" ({type(cause).__name__}: {cause})" if cause is not None else ""
        super().__init__(f"the answer's body broke off after {count} of the {promised} bytes it promised{how}")
        self.count = count


def _status(error: BaseException) -> int | None:
    """The HTTP status of a failed answer: botocore's ``response``, aiohttp's ``status``."""
    response = getattr(error, "response", None)
    if isinstance(response, Mapping):
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return status if isinstance(status, int) else None
    status = getattr(error, "status", None)
    return status if isinstance(status, int) and 100 <= status < 600 else None


def error_code(error: BaseException) -> str:
    """The error code of a failed answer (``SlowDown``, ``NoSuchKey``, ...), or ``""``."""
    response = getattr(error, "response", None)
    return str(response.get("Error", {}).get("Code", "")) if isinstance(response, Mapping) else ""


def transient(error: BaseException) -> bool:
    """Whether ``error`` is a failure of the storage that passes, worth trying again.

    A missing file whose cause passes (fsspec's http reports a refused ``HEAD`` so) passes too.

    >>> from jaxstow._storage.retrying import transient
    >>> transient(ConnectionResetError(104, "reset")), transient(FileNotFoundError("w.jxs"))
    (True, False)
    """
    return _passing(error) is not None


def _passing(error: BaseException) -> BaseException | None:
    """``error``, or the first of its causes, that passes; ``None`` if none does."""
    seen: set[int] = set()
    found: BaseException | None = error
    while found is not None and id(found) not in seen and not isinstance(found, JaxstowError):
        if _passes(found):
            return found
        seen.add(id(found))
        found = found.__cause__
    return None


def _passes(error: BaseException) -> bool:
    if isinstance(error, ConnectionError | TimeoutError | http.client.HTTPException):
        return True
    status = _status(error)
    if status is not None:
        return status == 429 or status in (500, 502, 503, 504) or error_code(error) in _CODES
    if error_code(error) in _CODES or {kind.__name__ for kind in type(error).__mro__} & _NAMES:
        return True
    return isinstance(error, OSError) and not isinstance(error, FileNotFoundError) and error.errno in _ERRNOS


@dataclass(frozen=True)
class Retries:
    """How often, and how patiently, a request that fails for a reason that passes is sent again."""

    attempts: int = DEFAULT_ATTEMPTS
    backoff: float = 1.0

    def wait(self, retry: int) -> float:
        """Seconds to wait before the ``retry``-th retry: random, up to ``backoff * 2 ** (retry - 1)``."""
        return random.uniform(0.0, min(MAX_BACKOFF, self.backoff * 2.0 ** (retry - 1)))

    def call(self, request: Callable[[], T], *, url: str, doing: str) -> T:
        """``request()``, sent again after each failure that passes, up to ``attempts`` times in all.

        Any other failure is raised as it is; one that passes every time is a :class:`StorageError` naming ``url``,
        what was being done (``doing``: ``"read bytes 0-65535 (GetObject)"``), the attempts and the last failure.
        """
        for attempt in range(1, self.attempts + 1):
            try:
                return request()
            except Exception as error:
                if not transient(error):
                    raise
                if attempt == self.attempts:
                    raise self.gave_up(error, url=url, doing=doing) from error
            time.sleep(self.wait(attempt))
        raise AssertionError("unreachable: attempts is at least 1")

    def gave_up(self, error: BaseException, *, url: str, doing: str) -> StorageError:
        """The error of a request that failed ``attempts`` times for reasons that pass."""
        shown = _passing(error) or error  # a missing file's cause, when that is what passes
        last = f"{type(shown).__name__}: {shown}".replace("\n", " ")
        times = "once" if self.attempts == 1 else f"{self.attempts} times"
        return StorageError(
            f"the storage failed: {doing} failed {times} (the last: {last}); this is the storage, not the file, "
            f"which may well be whole: try again later, or give the storage more room with "
            f"jaxstow.Transfer(attempts=..., backoff=...) (now {self.attempts} attempt{'s' * (self.attempts > 1)}, "
            f"backoff {self.backoff:g} s), or, on S3 and from the command line, the environment's AWS_MAX_ATTEMPTS",
            file=url,
        )


def configured_attempts(retries: Mapping[str, Any] | None, environment: int | None = None) -> int | None:
    """The attempts in all that a botocore ``retries`` config gives (``total_max_attempts``, or ``max_attempts``
    retries after the first), else ``environment`` (``AWS_MAX_ATTEMPTS``, a total), else ``None``.

    >>> configured_attempts({"max_attempts": 9}), configured_attempts({"total_max_attempts": 3}), configured_attempts({})
    (10, 3, None)
    """
    retries = retries or {}
    if isinstance(retries.get("total_max_attempts"), int):
        return max(1, int(retries["total_max_attempts"]))
    if isinstance(retries.get("max_attempts"), int):
        return max(1, int(retries["max_attempts"]) + 1)
    return max(1, environment) if isinstance(environment, int) else None
