"""FindCoordinator (10), JoinGroup (11), SyncGroup (14), Heartbeat (12) and
LeaveGroup (13): the classic group protocol, answered by ``coordinator.Coordinator``.

This broker is every group's coordinator (and every transaction's: FindCoordinator
names it for any key type, the transactional APIs then refuse).
"""

from __future__ import annotations

from typing import Any

from .broker import Broker
from .codec import ErrorCode, Request, build, response_class

__all__ = [
    "handle_find_coordinator",
    "handle_heartbeat",
    "handle_join_group",
    "handle_leave_group",
    "handle_sync_group",
]


def _response(request: Request, **values: Any) -> Any:
    cls = response_class(request.api_key, request.api_version)
    assert cls is not None
    return build(cls, throttle_time=0, **values)


async def handle_find_coordinator(broker: Broker, request: Request) -> Any:
    """Answer FindCoordinator: this broker, for every key."""
    body = request.body
    me = {
        "node_id": broker.node_id,
        "host": broker.advertised_host,
        "port": broker.advertised_port,
        "error_code": ErrorCode.none,
        "error_message": None,
    }
    if request.api_version >= 4:
        return _response(
            request, coordinators=[{"key": key, **me} for key in body.coordinator_keys]
        )
    return _response(request, **me)


async def handle_join_group(broker: Broker, request: Request) -> Any:
    """Answer JoinGroup once the group's round completes."""
    body = request.body
    result = await broker.groups.join(
        body.group_id,
        body.member_id,
        client_id=request.client_id or "",
        host=f"/{request.peer_host}",
        protocol_type=body.protocol_type,
        protocols=[(p.name, bytes(p.metadata)) for p in body.protocols],
        session_timeout_ms=int(body.session_timeout.total_seconds() * 1000),
        rebalance_timeout_ms=int(
            getattr(body, "rebalance_timeout", body.session_timeout).total_seconds() * 1000
        ),
    )
    return _response(
        request,
        error_code=result.error,
        generation_id=result.generation,
        protocol_type=result.protocol_type,
        protocol_name=result.protocol_name or ("" if request.api_version < 7 else None),
        leader=result.leader,
        member_id=result.member_id,
        members=[
            {"member_id": member_id, "group_instance_id": None, "metadata": metadata}
            for member_id, metadata in result.members
        ],
    )


async def handle_sync_group(broker: Broker, request: Request) -> Any:
    """Answer SyncGroup with the member's share of the leader's assignment."""
    body = request.body
    error, assignment, protocol_type, protocol_name = await broker.groups.sync(
        body.group_id,
        body.generation_id,
        body.member_id,
        {a.member_id: bytes(a.assignment) for a in body.assignments},
    )
    return _response(
        request,
        error_code=error,
        assignment=assignment,
        protocol_type=protocol_type,
        protocol_name=protocol_name,
    )


async def handle_heartbeat(broker: Broker, request: Request) -> Any:
    """Answer Heartbeat."""
    body = request.body
    error = broker.groups.heartbeat(body.group_id, body.generation_id, body.member_id)
    return _response(request, error_code=error)


async def handle_leave_group(broker: Broker, request: Request) -> Any:
    """Answer LeaveGroup (one member before v3, a list from v3)."""
    body = request.body
    if request.api_version < 3:
        outcome = await broker.groups.leave(body.group_id, [body.member_id])
        return _response(request, error_code=outcome[body.member_id])
    ids = [m.member_id for m in body.members]
    outcome = await broker.groups.leave(body.group_id, ids)
    return _response(
        request,
        error_code=ErrorCode.none,
        members=[
            {
                "member_id": m.member_id,
                "group_instance_id": m.group_instance_id,
                "error_code": outcome[m.member_id],
            }
            for m in body.members
        ],
    )
