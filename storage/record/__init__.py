"""The record format: records, batches and the ``.log`` file (Kafka's ``common/record``).

Bytes to records and back. Nothing here knows of segments or indexes; it depends only
on ``storage.errors``. Modules marked compiled are built with mypyc when installed
(``COMPILED_MODULES`` in ``setup.py``).

- ``record``: ``Record``, ``Header`` and the format's enums (``CompressionType``,
  ``TimestampType``).
- ``varint``: Kafka's varints, ZigZag then LEB128. Compiled.
- ``compression``: the codecs (gzip, snappy with xerial framing, lz4 frames, zstd).
- ``record_batch``: reading batches, v2 (``DefaultRecordBatch``) and legacy v0/v1
  (``LegacyRecordBatch``), and walking a buffer of them. Compiled.
- ``legacy_record``: decoding the v0/v1 message formats (Kafka's ``LegacyRecord``).
- ``batch_builder``: building v2 batches (Kafka's ``MemoryRecordsBuilder``). Compiled.
- ``record_columns``: records as columns (``RecordColumns``, ``PackedColumns``) and the
  v2 record decoder that makes them. Compiled.
- ``render``: records as the bytes a partition file shows, a batch at a time. Compiled.
- ``file_records``: a segment's ``.log`` file, batches back to back (``FileRecords``,
  as Kafka's).
"""
