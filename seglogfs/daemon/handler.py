"""The error boundary of every FUSE request: only ``FUSEError`` leaves a handler.

S3QL's rule: an exception escaping to pyfuse3 would end the main loop and leave a dead
mount. ``@handler`` wraps each request handler: engine errors become an errno through
the one table in ``errno_map``; anything unexpected is a bug, logged with its traceback
(once per handler and exception type, a line after that, so a loop of ``cat`` retries
cannot flood the log) and answered ``EIO``. A damaged batch (``CorruptRecordError``) is
answered ``EIO`` on every read that reaches it and logged once, as a WARNING naming the
topic, partition, offset, file and byte: every reader meets it again, the log says it
once.

Thread-safety: used on the trio thread only.
"""

from __future__ import annotations

import errno
import functools
import logging
from collections.abc import Callable, Coroutine
from pathlib import Path
from time import perf_counter
from typing import Any, ParamSpec, TypeVar

import pyfuse3

from storage import CorruptRecordError
from storage.log.file_names import parse_topic_partition_name

from . import metrics
from .errno_map import errno_for

__all__ = ["REQUEST_LOG", "RequestLog", "enable_request_logging", "fail", "handler"]

logger = logging.getLogger(__name__)

_P = ParamSpec("_P")
_T = TypeVar("_T")

_logged_failures: set[tuple[str, str]] = set()
# (segment file, byte) of each damaged batch already logged: one line per damaged batch,
# however many reads meet it (a set as small as the damage on disk).
_logged_damage: set[tuple[str, int]] = set()


class RequestLog:
    """Whether every read and write is logged at DEBUG (``seglogfs mount --debug``):
    a check of one attribute on the hot path when it is off."""

    __slots__ = ("enabled",)

    def __init__(self) -> None:
        self.enabled = False


REQUEST_LOG = RequestLog()


def enable_request_logging(enabled: bool) -> None:
    """Log every read and write at DEBUG (``seglogfs mount --debug``)."""
    REQUEST_LOG.enabled = enabled


def _failure(handler: str, exc: Exception) -> pyfuse3.FUSEError:
    code = errno_for(exc)
    if code is None:
        # A bug, not a user's mistake: the traceback once per handler and exception
        # type (a loop of `cat` retries must not flood the log), a line after that.
        key = (handler, type(exc).__qualname__)
        if key in _logged_failures:
            logger.error("%s failed again: %s: %s", handler, type(exc).__name__, exc)
        else:
            _logged_failures.add(key)
            logger.error("%s failed: answered EIO", handler, exc_info=exc)
        code = errno.EIO
    elif isinstance(exc, CorruptRecordError):
        _log_damage_once(exc)
    elif code == errno.EIO:
        logger.error("%s: %s", handler, exc)
    return pyfuse3.FUSEError(code)


def _log_damage_once(exc: CorruptRecordError) -> None:
    key = (str(exc.path), exc.position)
    if key in _logged_damage:
        return
    _logged_damage.add(key)
    where = "a partition"
    if exc.path is not None:
        parsed = parse_topic_partition_name(Path(exc.path).parent.name)
        if parsed is not None:
            where = f"topic {parsed[0]} partition {parsed[1]}"
    logger.warning(
        "%s: %s; reads that reach it fail with EIO (seglogfs delete-records moves the log "
        "start past it)",
        where,
        exc,
    )


def handler(
    fn: Callable[_P, Coroutine[Any, Any, _T]],
) -> Callable[_P, Coroutine[Any, Any, _T]]:
    """Wrap a request handler: only ``FUSEError`` leaves it (an exception escaping to
    pyfuse3 would end the main loop and leave a dead mount)."""
    name = fn.__name__

    @functools.wraps(fn)
    async def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        counters = metrics.COUNTERS  # None unless --metrics: one check when off
        started = perf_counter() if counters is not None else 0.0
        try:
            return await fn(*args, **kwargs)
        except pyfuse3.FUSEError as exc:
            if counters is not None:
                counters.fuse_error(name, exc.errno)
            raise
        except Exception as exc:
            failure = _failure(name, exc)
            if counters is not None:
                counters.fuse_error(name, failure.errno)
            raise failure from None
        finally:
            if counters is not None:
                counters.fuse_request(name, perf_counter() - started)

    return wrapper


def fail(code: int) -> pyfuse3.FUSEError:
    return pyfuse3.FUSEError(code)
