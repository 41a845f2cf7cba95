"""The ``seglog`` data source: Spark's entry point to readers and writers.

Spark creates a ``SeglogDataSource`` with the query's options in a planner process
and asks it for the schema and a batch or stream reader or writer; those objects are
then pickled to the tasks. Options are checked here, so a mistake fails the query
while it is planned, with a message naming the option.

A query that gives its own schema (``.schema("value binary")``) is not asked for the
source's: Spark hands that schema to ``reader``/``streamReader`` instead of
``schema()``'s, and it is read as a projection of the Kafka schema (``Projection``),
checked there, so a column the Kafka schema lacks or a wrong type also fails the
query while it is planned, naming the column.
"""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from .arrow import Projection, spark_schema
from .errors import OptionError, SinkError
from .options import ReadOptions
from .reader import SeglogBatchReader, freeze_worker_heap
from .stream import SeglogStreamReader
from .writer import SeglogBatchWriter, SeglogStreamWriter, check_sink_schema


class SeglogDataSource(DataSource):
    """``spark.read.format("seglog").option("subscribe", T).load(LOGDIR)`` and the
    matching ``readStream``, ``write`` and ``writeStream`` (see ``seglogfs.spark``)."""

    @classmethod
    def name(cls) -> str:
        return "seglog"

    def schema(self) -> StructType:
        freeze_worker_heap()  # Spark's planner process (see freeze_worker_heap)
        include_headers = str(self.options.get("includeHeaders", "false")).strip().lower()
        return spark_schema(include_headers == "true")

    def _read(self, schema: StructType, *, streaming: bool) -> tuple[ReadOptions, Projection]:
        opts = ReadOptions.parse(dict(self.options), streaming=streaming)
        return opts, Projection.of(schema, include_headers=opts.include_headers)

    def reader(self, schema: StructType) -> DataSourceReader:
        return SeglogBatchReader(*self._read(schema, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return SeglogStreamReader(*self._read(schema, streaming=True))

    def _sink(self, schema: StructType) -> tuple[str, str | None]:
        options = {k.lower(): v for k, v in self.options.items()}
        log_dir = options.get("path")
        if not log_dir:
            raise OptionError("path", None, "give the log directory: .save(LOGDIR)")
        topic = options.get("topic")
        check_sink_schema(schema, topic)
        return log_dir, topic

    def _auto_create(self) -> bool:
        """The sink's ``auto.create.topics.enable`` (Kafka's broker default: true)."""
        options = {k.lower(): v for k, v in self.options.items()}
        raw = str(options.get("auto.create.topics.enable", "true")).strip().lower()
        if raw not in ("true", "false"):
            raise OptionError("auto.create.topics.enable", raw, "must be true or false")
        return raw == "true"

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise SinkError("a seglog topic is append-only: use mode('append')")
        log_dir, topic = self._sink(schema)
        options = {k.lower(): v for k, v in self.options.items()}
        app_id, version = options.get("txnappid"), options.get("txnversion")
        if (app_id is None) != (version is None):
            raise OptionError("txnAppId/txnVersion", app_id or version, "give both or neither")
        txn = None
        if app_id is not None and version is not None:
            try:
                txn = (app_id, int(version))
            except ValueError:
                raise OptionError("txnVersion", version, "must be an integer") from None
        return SeglogBatchWriter(log_dir, topic, txn, self._auto_create())

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        log_dir, topic = self._sink(schema)
        checkpoint = {k.lower(): v for k, v in self.options.items()}.get("checkpointlocation")
        return SeglogStreamWriter(log_dir, topic, checkpoint, self._auto_create())
