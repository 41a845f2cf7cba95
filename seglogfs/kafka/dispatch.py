"""Request dispatch: each API key to its handler, and Kafka's answer to the others.

An API key or version this broker does not answer (``versions.SUPPORTED``) gets
``UNSUPPORTED_VERSION``, never a closed connection: ApiVersions at version 0 with the
supported list (what Kafka sends, so the client can pick a version), any other API a
response of its own schema with that error code and nothing else; a key or version
that even kio has no schema for gets the response header and the error code alone.
"""

from __future__ import annotations

import struct
from collections.abc import Awaitable, Callable
from typing import Any, Final

from .api_versions import api_versions_response, handle_api_versions
from .broker import Broker
from .codec import (
    API_VERSIONS_KEY,
    ErrorCode,
    Request,
    ResponseFrame,
    encode_response,
    error_response,
)
from .configs import (
    handle_alter_configs,
    handle_describe_configs,
    handle_incremental_alter_configs,
)
from .fetch import handle_fetch
from .group_admin import handle_delete_groups, handle_describe_groups, handle_list_groups
from .groups import (
    handle_find_coordinator,
    handle_heartbeat,
    handle_join_group,
    handle_leave_group,
    handle_sync_group,
)
from .metadata import handle_metadata
from .offsets import handle_list_offsets, handle_offset_commit, handle_offset_fetch
from .produce import handle_produce
from .producers import handle_init_producer_id
from .topics import (
    handle_create_partitions,
    handle_create_topics,
    handle_delete_records,
    handle_delete_topics,
)
from .versions import SUPPORTED

__all__ = ["HANDLERS", "respond"]

Handler = Callable[[Broker, Request], Awaitable[Any]]

HANDLERS: Final[dict[int, Handler]] = {
    0: handle_produce,
    1: handle_fetch,
    2: handle_list_offsets,
    3: handle_metadata,
    8: handle_offset_commit,
    9: handle_offset_fetch,
    10: handle_find_coordinator,
    11: handle_join_group,
    12: handle_heartbeat,
    13: handle_leave_group,
    14: handle_sync_group,
    15: handle_describe_groups,
    16: handle_list_groups,
    18: handle_api_versions,
    19: handle_create_topics,
    20: handle_delete_topics,
    21: handle_delete_records,
    22: handle_init_producer_id,
    32: handle_describe_configs,
    33: handle_alter_configs,
    37: handle_create_partitions,
    42: handle_delete_groups,
    44: handle_incremental_alter_configs,
}
assert HANDLERS.keys() == SUPPORTED.keys()


async def respond(broker: Broker, request: Request) -> ResponseFrame | None:
    """The response frame of ``request``; None when none is sent (Produce, acks=0)."""
    if request.body is None:
        return unsupported(request)
    response = await HANDLERS[request.api_key](broker, request)
    if response is None:
        return None
    return encode_response(request.correlation_id, response)


def unsupported(request: Request) -> ResponseFrame:
    """``UNSUPPORTED_VERSION`` for a key or version this broker does not answer."""
    code = ErrorCode.unsupported_version
    if request.api_key == API_VERSIONS_KEY:
        return encode_response(request.correlation_id, api_versions_response(0, code))
    response = error_response(request.api_key, request.api_version, code)
    if response is not None:
        return encode_response(request.correlation_id, response)
    # No schema anywhere: the v0 response header and the error code.
    body = struct.pack(">ih", request.correlation_id, code.value)
    return ResponseFrame.of(struct.pack(">i", len(body)) + body)
