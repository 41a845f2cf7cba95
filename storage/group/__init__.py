"""Consumer groups: committed offsets in ``__consumer_offsets`` (Kafka's
``group-coordinator`` module), built on ``log`` and ``record``.

- ``coordinator_record``: the offsets topic's record schemas (offset commit keys v0/v1
  and values v0-v4, group metadata keys v2 and values v0-v4, flexible versions with
  tagged fields), read and written.
- ``offsets_topic``: the topic's name and settings, and the partition of a group
  (``abs(String.hashCode(group)) % partitions``, as Kafka places it).
- ``offset_store``: the committed offsets of every group, cached from the topic, and the
  live members that make a group consuming (``OffsetStore``).
- ``errors``: the group errors, a branch of ``StorageError``.
"""
