"""The group coordinator's errors: a branch of the engine's one tree (``StorageError``).

They are Kafka's group errors, with its wording where a tool prints it:

- ``GroupIdNotFoundError``: no such group (Kafka's ``GROUP_ID_NOT_FOUND``).
- ``InvalidGroupIdError``: an empty group id (``INVALID_GROUP_ID``): a usage error.
- ``NonEmptyGroupError``: the group has live members, so its offsets cannot be reset
  nor the group deleted (``NON_EMPTY_GROUP``; ``kafka-consumer-groups.sh`` says the
  group must be inactive).
- ``PartitionAssignedError``: a partition of the group is being consumed by another
  live member: one reader per partition and group.
- ``UnknownMemberIdError``: a member that left, or never joined (``UNKNOWN_MEMBER_ID``).
- ``NoOffsetForPartitionError``: no committed offset and the reset rule is ``none``
  (the consumer's ``NoOffsetForPartitionException``).

They live here, beside the store, rather than in ``storage.errors``: that module is a
source of the compiled engine, whose build records its hash.
"""

from __future__ import annotations

from ..errors import ConfigError, StorageError

__all__ = [
    "GroupError",
    "GroupIdNotFoundError",
    "InvalidGroupIdError",
    "NoOffsetForPartitionError",
    "NonEmptyGroupError",
    "PartitionAssignedError",
    "UnknownMemberIdError",
]


class GroupError(StorageError):
    """Root of the consumer group errors; ``group`` names the group."""

    def __init__(self, group: str, message: str) -> None:
        super().__init__(message)
        self.group = group


class GroupIdNotFoundError(GroupError):
    """No group of that id has offsets or members."""

    def __init__(self, group: str) -> None:
        super().__init__(group, f"consumer group '{group}' does not exist")


class InvalidGroupIdError(ConfigError):
    """A group id Kafka refuses: the empty one. A ``ConfigError``: the command line
    was wrong (exit 2)."""

    def __init__(self, group: str) -> None:
        super().__init__("group", group, "the group id must not be empty")
        self.group = group
        self.args = ("the group id must not be empty",)


class NonEmptyGroupError(GroupError):
    """The group has live members: its offsets can be neither reset nor deleted."""

    def __init__(self, group: str, members: list[str]) -> None:
        shown = ", ".join(members[:3]) + (", ..." if len(members) > 3 else "")
        super().__init__(
            group,
            f"consumer group '{group}' is not empty: it is consuming (members: {shown}); "
            "stop its consumers first",
        )
        self.members = members


class PartitionAssignedError(GroupError):
    """Partitions of the group are held by another live member (one reader each)."""

    def __init__(self, group: str, partitions: list[tuple[str, int]], member: str) -> None:
        shown = ",".join(f"{t}-{p}" for t, p in partitions[:5])
        if len(partitions) > 5:
            shown += ",..."
        super().__init__(
            group,
            f"partition {shown} of consumer group '{group}' is being consumed by member {member}",
        )
        self.partitions = partitions
        self.member = member


class UnknownMemberIdError(GroupError):
    """The member is not (or no longer) a member of the group."""

    def __init__(self, group: str, member: str) -> None:
        super().__init__(group, f"member {member} is not a member of consumer group '{group}'")
        self.member = member


class NoOffsetForPartitionError(GroupError):
    """No committed offset, and the reset rule is ``none``."""

    def __init__(self, group: str, topic: str, partition: int) -> None:
        super().__init__(
            group,
            f"consumer group '{group}' has no committed offset for partition "
            f"{topic}-{partition} and the reset rule is none",
        )
        self.topic = topic
        self.partition = partition
