"""The log: indexes, segments, partition logs, the log directory (Kafka's
``storage/internals/log``).

Builds on ``storage.record.record`` for the bytes of the ``.log`` files.

- ``index``: the memory-mapped, fixed-entry-size index file (``AbstractIndex``).
- ``offset_index``: the ``.index`` file, offsets to byte positions (``OffsetIndex``).
- ``time_index``: the ``.timeindex`` file, timestamps to offsets (``TimeIndex``).
- ``extension_index``: one more sparse index per segment, of a cumulative size the
  caller defines (``ExtensionIndex``, ``ExtensionIndexSpec``).
- ``segment``: one segment, a ``.log`` file and its indexes (``LogSegment``).
- ``log_segments``: the sorted map of a log's segments by base offset (``LogSegments``).
- ``log``: a partition's log: append, read, roll and retention (``Log``).
- ``log_loader``: opening a partition's log, with crash recovery (Kafka's
  ``LogLoader``: ``load_log``, ``refresh_segments``).
- ``log_manager``: the log directory: its topics, their logs, checkpoints and the
  writer lock (``LogManager``).
- ``checkpoint``: Kafka's offset checkpoint files, and the extension start checkpoint.
- ``log_config``: Kafka's log settings, defaults and validation (``LogConfig``,
  ``BrokerConfig``).
- ``properties``: Java ``.properties`` syntax, as Kafka reads ``server.properties``.
- ``file_names``: every file name the engine reads or writes (Kafka's ``LogFileUtils``).
- ``lock_file``: the one-writer-per-log-directory lock (``LogDirLock``).
- ``topic``: topic names and metadata, and the topics file (``TopicMetadata``).
"""
