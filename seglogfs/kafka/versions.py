"""The API versions this broker answers (what ApiVersions advertises).

Each range is what kio has schemas for, capped where a newer version needs what this
broker does not keep: topic ids (Fetch v13+, Produce v13+), tiered storage offsets
(ListOffsets v8+), the new consumer group protocol's member epochs (OffsetCommit v9+,
OffsetFetch v9+) and KIP-890 transactions (InitProducerId v5+). Clients pick the
highest version both sides know: kafka-python 2.x/3.x and librdkafka 2.x all find theirs
in these ranges.
"""

from __future__ import annotations

from typing import Final

__all__ = ["API_NAMES", "SUPPORTED", "supported"]

SUPPORTED: Final[dict[int, tuple[int, int]]] = {
    0: (3, 9),  # Produce
    1: (4, 12),  # Fetch
    2: (1, 7),  # ListOffsets
    3: (0, 12),  # Metadata
    8: (2, 8),  # OffsetCommit
    9: (1, 8),  # OffsetFetch
    10: (0, 4),  # FindCoordinator
    11: (0, 7),  # JoinGroup
    12: (0, 4),  # Heartbeat
    13: (0, 4),  # LeaveGroup
    14: (0, 5),  # SyncGroup
    15: (0, 6),  # DescribeGroups
    16: (0, 5),  # ListGroups
    18: (0, 4),  # ApiVersions
    19: (2, 7),  # CreateTopics (kio has no v0/v1)
    20: (1, 6),  # DeleteTopics (kio has no v0; v6's topic ids: UNKNOWN_TOPIC_ID)
    21: (0, 2),  # DeleteRecords
    22: (0, 4),  # InitProducerId
    32: (1, 4),  # DescribeConfigs (kio has no v0)
    33: (0, 2),  # AlterConfigs
    37: (0, 3),  # CreatePartitions
    42: (0, 2),  # DeleteGroups
    44: (0, 1),  # IncrementalAlterConfigs
}
"""API key -> (lowest, highest) version answered."""

API_NAMES: Final[dict[int, str]] = {
    0: "Produce",
    1: "Fetch",
    2: "ListOffsets",
    3: "Metadata",
    8: "OffsetCommit",
    9: "OffsetFetch",
    10: "FindCoordinator",
    11: "JoinGroup",
    12: "Heartbeat",
    13: "LeaveGroup",
    14: "SyncGroup",
    15: "DescribeGroups",
    16: "ListGroups",
    18: "ApiVersions",
    19: "CreateTopics",
    20: "DeleteTopics",
    21: "DeleteRecords",
    22: "InitProducerId",
    32: "DescribeConfigs",
    33: "AlterConfigs",
    37: "CreatePartitions",
    42: "DeleteGroups",
    44: "IncrementalAlterConfigs",
}


def supported(api_key: int, api_version: int) -> bool:
    """Whether this broker answers ``api_key`` at ``api_version``."""
    bounds = SUPPORTED.get(api_key)
    return bounds is not None and bounds[0] <= api_version <= bounds[1]
