"""ListGroups (16), DescribeGroups (15) and DeleteGroups (42): the groups of the
directory, over the coordinator's live groups and the ``OffsetStore``.

A group is what either knows: the coordinator's groups (Kafka clients' members, their
state, protocol, subscriptions and assignments) and the store's (committed offsets,
members of ``P@group=NAME`` views and ``seglogfs groups``). A group with live Kafka
members is shown as the coordinator has it; one without is shown as the store has it:
``Stable`` with the views' members (protocol type empty: they are no Kafka members,
their subscription and assignment empty) or ``Empty``. Every group is a ``classic``
group. DeleteGroups deletes a group's committed offsets (tombstones in
``__consumer_offsets``) when it has no live member of either kind, else
``NON_EMPTY_GROUP``; an unknown group is ``GROUP_ID_NOT_FOUND``.
"""

from __future__ import annotations

from typing import Any

from storage import (
    GroupDescription,
    GroupError,
    GroupIdNotFoundError,
    NonEmptyGroupError,
    OffsetStore,
    StorageError,
)

from .broker import Broker, error_code_of
from .codec import ErrorCode, Request, build, response_class
from .coordinator import EMPTY, GroupView, MemberView

__all__ = ["handle_delete_groups", "handle_describe_groups", "handle_list_groups"]

DEAD = "Dead"
CLASSIC = "classic"
NO_OPERATIONS = -2147483648
"""``authorized_operations`` when the client did not ask for them (Kafka's INT_MIN)."""


def _response(request: Request, **values: Any) -> Any:
    cls = response_class(request.api_key, request.api_version)
    assert cls is not None
    return build(cls, throttle_time=0, **values)


def _store_groups(store: OffsetStore) -> dict[str, GroupDescription]:
    """Every group of the store, described (blocking: a worker thread)."""
    found: dict[str, GroupDescription] = {}
    for group in store.list_groups():
        try:
            found[group] = store.describe_group(group)
        except GroupIdNotFoundError:  # deleted meanwhile
            continue
    return found


def _store_group(store: OffsetStore, group: str) -> GroupDescription | None:
    try:
        return store.describe_group(group)
    except GroupIdNotFoundError:
        return None


def _store_view(description: GroupDescription) -> GroupView:
    members = tuple(
        MemberView(m.member_id, m.client_id, m.host, b"", b"") for m in description.members
    )
    return GroupView(description.state, "", "", members)


def _merged(live: GroupView | None, stored: GroupDescription | None) -> GroupView | None:
    """The group as this broker shows it (see the module)."""
    if live is not None and (live.members or stored is None):
        return live
    if stored is not None:
        return _store_view(stored)
    return None


async def handle_list_groups(broker: Broker, request: Request) -> Any:
    """Answer ListGroups (states filter from v4, types filter from v5)."""
    body = request.body
    stored = await broker.run_sync(_store_groups, broker.groups.store)
    live = broker.groups.live_groups()
    states = {s.lower() for s in getattr(body, "states_filter", ())}
    types = {t.lower() for t in getattr(body, "types_filter", ())}
    groups = []
    for group_id in sorted(set(stored) | set(live)):
        view = _merged(live.get(group_id), stored.get(group_id))
        if view is None:
            continue
        if states and view.state.lower() not in states:
            continue
        if types and CLASSIC not in types:
            continue
        groups.append(
            {
                "group_id": group_id,
                "protocol_type": view.protocol_type,
                "group_state": view.state,
                "group_type": CLASSIC,
            }
        )
    return _response(request, error_code=ErrorCode.none, groups=groups)


async def handle_describe_groups(broker: Broker, request: Request) -> Any:
    """Answer DescribeGroups: an unknown group is ``Dead`` with no error before v6,
    ``GROUP_ID_NOT_FOUND`` from v6 (as Kafka 4 answers)."""
    groups = []
    for group_id in request.body.groups:
        entry: dict[str, Any] = {
            "group_id": group_id,
            "error_code": ErrorCode.none,
            "error_message": None,
            "group_state": DEAD,
            "protocol_type": "",
            "protocol_data": "",
            "members": [],
            "authorized_operations": NO_OPERATIONS,
        }
        groups.append(entry)
        if not group_id:
            entry["error_code"] = ErrorCode.invalid_group_id
            continue
        try:
            stored = await broker.run_sync(_store_group, broker.groups.store, group_id)
        except (StorageError, OSError) as exc:
            entry["error_code"] = error_code_of(exc)
            entry["error_message"] = str(exc)
            continue
        view = _merged(broker.groups.live_group(group_id), stored)
        if view is None:
            if request.api_version >= 6:
                entry["error_code"] = ErrorCode.group_id_not_found
                entry["error_message"] = f"Group {group_id} not found."
            continue
        entry.update(
            group_state=view.state,
            protocol_type=view.protocol_type,
            protocol_data=view.protocol_name,
            members=[
                {
                    "member_id": m.member_id,
                    "group_instance_id": None,
                    "client_id": m.client_id,
                    "client_host": m.host,
                    "member_metadata": m.metadata,
                    "member_assignment": m.assignment,
                }
                for m in view.members
            ],
        )
    return _response(request, groups=groups)


def _delete_group(store: OffsetStore, group: str) -> ErrorCode:
    """Delete ``group``'s offsets (blocking: a worker thread)."""
    try:
        store.delete_group(group)
    except GroupIdNotFoundError:
        return ErrorCode.group_id_not_found
    except NonEmptyGroupError:
        return ErrorCode.non_empty_group
    except (GroupError, StorageError, OSError) as exc:
        return error_code_of(exc)
    return ErrorCode.none


async def handle_delete_groups(broker: Broker, request: Request) -> Any:
    """Answer DeleteGroups."""
    results = []
    for group_id in request.body.groups_names:
        if not group_id:
            code = ErrorCode.invalid_group_id
        else:
            live = broker.groups.live_group(group_id)
            if live is not None and live.members:
                code = ErrorCode.non_empty_group
            else:
                code = await broker.run_sync(_delete_group, broker.groups.store, group_id)
                if live is not None and live.state == EMPTY:
                    if code is ErrorCode.group_id_not_found:
                        code = ErrorCode.none  # known here only: nothing was committed
                    if code is ErrorCode.none:
                        broker.groups.forget(group_id)
        results.append({"group_id": group_id, "error_code": code})
    return _response(request, results=results)
