"""ApiVersions (key 18): the versions of every API this broker answers.

A request of a version this broker does not know is answered at version 0 with
``UNSUPPORTED_VERSION`` and the list, as Kafka answers it, so the client retries with
a version both know (the dispatcher does that; see ``dispatch``).
"""

from __future__ import annotations

from typing import Any

from .broker import Broker
from .codec import ErrorCode, Request, build, response_class
from .versions import SUPPORTED

__all__ = ["api_versions_response", "handle_api_versions"]


def api_versions_response(version: int, error: ErrorCode = ErrorCode.none) -> Any:
    """The ApiVersions response of ``version`` listing ``SUPPORTED``."""
    cls = response_class(18, version)
    assert cls is not None
    keys = [
        {"api_key": key, "min_version": low, "max_version": high}
        for key, (low, high) in sorted(SUPPORTED.items())
    ]
    return build(cls, error_code=error, api_keys=keys, throttle_time=0)


async def handle_api_versions(broker: Broker, request: Request) -> Any:
    """Answer ApiVersions."""
    return api_versions_response(request.api_version)
