"""The Spark data source's exceptions: one tree under ``SeglogSparkError``.

Spark shows a Python error raised while planning or running a query as its message
inside an ``AnalysisException`` / ``PythonException``; each message here therefore
names the option, topic-partition or directory at fault and what to do about it.

- ``OptionError``: a reader or writer option Spark's Kafka source would also refuse
  (a bad value, a missing or conflicting option). Raised while the query is planned.
- ``SchemaError``: a schema given with ``.schema(...)`` that is not a projection of
  the Kafka schema (a column it lacks, named twice, or of another type). Raised while
  the query is planned.
- ``DataLossError``: offsets a query needs are gone (removed by retention, or a log
  shorter than a checkpoint says) and ``failOnDataLoss`` is true, as Kafka reports it.
- ``CorruptDataError``: a batch a task reads is damaged (the engine's
  ``CorruptRecordError``) and ``failOnDataLoss`` is true: the task fails naming the
  topic, partition, offset and file; with ``failOnDataLoss=false`` the read skips the
  damaged range and logs it.
- ``SinkError``: the sink cannot write (unknown topic, bad columns, overwrite mode, a
  log directory another writer owns with no daemon to go through).
"""

from __future__ import annotations


class SeglogSparkError(Exception):
    """Root of every error raised by ``seglogfs.spark``."""


class OptionError(SeglogSparkError, ValueError):
    """Option ``name`` has an unacceptable value (``value`` is None when missing)."""

    def __init__(self, name: str, value: object, reason: str) -> None:
        shown = "missing" if value is None else f"{value!r}"
        super().__init__(f"seglog option {name} ({shown}): {reason}")
        self.name = name
        self.value = value
        self.reason = reason


class SchemaError(SeglogSparkError, ValueError):
    """Column ``column`` of a user-specified schema cannot be read: ``reason`` says why."""

    def __init__(self, column: str, reason: str) -> None:
        super().__init__(f"seglog schema: column {column!r} {reason}")
        self.column = column
        self.reason = reason


class DataLossError(SeglogSparkError):
    """Records ``[start, end)`` of ``topic``-``partition`` are no longer in the log."""

    def __init__(self, topic: str, partition: int, start: int, end: int, reason: str) -> None:
        super().__init__(
            f"data loss in {topic}-{partition}: offsets [{start}, {end}) {reason}. Some data "
            "may have been lost because it is no longer in the log (e.g. removed by "
            "retention). If you do not want the query to fail in such cases, set the "
            'option "failOnDataLoss" to "false".'
        )
        self.topic = topic
        self.partition = partition
        self.start = start
        self.end = end


class CorruptDataError(SeglogSparkError):
    """A batch of ``topic``-``partition`` at ``offset`` is damaged on disk (``cause``, the
    engine's error, names its file and byte); it is never served."""

    def __init__(self, topic: str, partition: int, offset: int, cause: Exception) -> None:
        super().__init__(
            f"corrupt data in topic {topic} partition {partition} at offset {offset}: "
            f"{cause}. The damaged batch is never served. If you want the query to skip "
            'the damaged records instead of failing, set the option "failOnDataLoss" to '
            '"false"; seglogfs delete-records moves the log start past them.'
        )
        self.topic = topic
        self.partition = partition
        self.offset = offset


class SinkError(SeglogSparkError):
    """The sink cannot write what it was given, or cannot write to the log directory."""
