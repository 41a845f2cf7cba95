"""The cleaner's key scan (``compaction_scan``): the same keys, offsets and tombstones
as the general decoder (``columns()``) for any batch, and the same error for a damaged
one; records it does not take (headers, long varints) go to that decoder."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.legacy_records import LegacyRecordBatchBuilder

from storage.errors import CorruptRecordError
from storage.log.compaction_scan import BatchKeys, batch_keys, scan_keys
from storage.record.batch_builder import build_record_batch
from storage.record.record import CompressionType
from storage.record.record_batch import (
    RECORD_BATCH_OVERHEAD,
    DefaultRecordBatch,
    LegacyRecordBatch,
    RecordBatch,
)

TS = 1_700_000_000_000

rows_strategy = st.lists(
    st.tuples(
        st.one_of(st.none(), st.binary(max_size=40)),  # value
        st.one_of(st.none(), st.binary(max_size=20)),  # key
        st.sampled_from([0, 0, 1, -3, 1 << 40]),  # timestamp delta
        st.sampled_from([1, 1, 1, 2, 70, 9000]),  # offset step
        st.booleans(),  # a header
    ),
    min_size=1,
    max_size=40,
)


def build(
    rows: list[tuple[bytes | None, bytes | None, int, int, bool]],
    codec: CompressionType = CompressionType.NONE,
    base_offset: int = 1000,
) -> bytes:
    deltas, delta = [], 0
    for _value, _key, _ts, step, _header in rows:
        deltas.append(delta)
        delta += step
    return build_record_batch(
        [r[0] for r in rows],
        keys=[r[1] for r in rows],
        timestamps=[TS + r[2] for r in rows],
        headers=[[("h", b"v")] if r[4] else [] for r in rows],
        base_offset=base_offset,
        codec=codec,
        offset_deltas=deltas,
    )


def expected_keys(batch: RecordBatch) -> tuple[list[bytes | None], list[int], list[bool]]:
    columns = batch.columns()
    return list(columns.keys), list(columns.offsets), [v is None for v in columns.values]


def as_tuple(scanned: BatchKeys) -> tuple[list[bytes | None], list[int], list[bool]]:
    nulls = scanned.nulls if scanned.nulls is not None else [False] * len(scanned)
    return scanned.keys, scanned.offsets, nulls


@settings(max_examples=200, deadline=None)
@given(rows=rows_strategy, codec=st.sampled_from([CompressionType.NONE, CompressionType.GZIP]))
def test_batch_keys_equal_the_decoded_columns(
    rows: list[tuple[bytes | None, bytes | None, int, int, bool]], codec: CompressionType
) -> None:
    batch = DefaultRecordBatch(build(rows, codec))
    scanned = batch_keys(batch)
    assert as_tuple(scanned) == expected_keys(batch)
    assert (scanned.nulls is None) == all(r[0] is not None for r in rows)


def test_records_without_headers_are_scanned_not_decoded() -> None:
    rows = [(b"v", b"k1", 0, 1, False), (None, b"k2", 5, 3, False), (b"w", None, 0, 1, False)]
    raw = build(rows)
    batch = DefaultRecordBatch(raw)
    scanned = scan_keys(raw, RECORD_BATCH_OVERHEAD, len(raw), batch.records_count, 1000)
    assert scanned is not None
    assert as_tuple(scanned) == ([b"k1", b"k2", None], [1000, 1001, 1004], [False, True, False])


def test_a_record_with_headers_goes_to_the_general_decoder() -> None:
    raw = build([(b"v", b"k", 0, 1, False), (b"v", b"k", 0, 1, True)])
    assert scan_keys(raw, RECORD_BATCH_OVERHEAD, len(raw), 2, 0) is None
    batch = DefaultRecordBatch(raw)
    assert as_tuple(batch_keys(batch)) == expected_keys(batch)


def test_a_legacy_batch_is_decoded() -> None:
    builder = LegacyRecordBatchBuilder(magic=1, compression_type=0, batch_size=1 << 20)
    builder.append(7, timestamp=TS, key=b"k", value=None)  # an entry holds one message
    batch = LegacyRecordBatch(bytes(builder.build()))
    assert as_tuple(batch_keys(batch)) == ([b"k"], [7], [True])


@settings(max_examples=400, deadline=None)
@given(
    rows=rows_strategy,
    where=st.integers(0, 10_000),
    byte=st.integers(0, 255),
    count_change=st.sampled_from([0, 0, 0, -1, 1]),
)
def test_a_damaged_batch_scans_as_the_general_decoder_decodes_it(
    rows: list[tuple[bytes | None, bytes | None, int, int, bool]],
    where: int,
    byte: int,
    count_change: int,
) -> None:
    # Damage inside the records (the CRC is not checked here: a batch whose CRC
    # matches bytes that do not parse is what this guards against).
    raw = bytearray(build(rows))
    position = RECORD_BATCH_OVERHEAD + where % (len(raw) - RECORD_BATCH_OVERHEAD)
    raw[position] = byte
    batch = DefaultRecordBatch(bytes(raw))
    count = batch.records_count + count_change
    scanned = scan_keys(bytes(raw), RECORD_BATCH_OVERHEAD, len(raw), count, 1000)
    if count_change:
        assert scanned is None
        return
    try:
        expected = expected_keys(batch)
    except CorruptRecordError:
        assert scanned is None
        with pytest.raises(CorruptRecordError):
            batch_keys(batch)
        return
    if scanned is not None:
        assert as_tuple(scanned) == expected
    assert as_tuple(batch_keys(batch)) == expected
