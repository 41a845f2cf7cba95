"""The shipped streaming word count produces the expected counts, across restarts."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from seglogfs.cli import main as cli_main
from seglogfs.spark import wordcount
from storage import LogManager, partition_for_key
from tests.control.test_control import call, serving


def _append_lines(log_dir: Path, lines: list[str]) -> None:
    with LogManager.open(log_dir) as manager:
        manager.log(wordcount.SOURCE_TOPIC, 0).append([line.encode() for line in lines])


def _count_records(log_dir: Path) -> list[tuple[int, bytes, bytes]]:
    """(partition, word, count) of every record of word-counts, in log order."""
    with LogManager.open(log_dir, read_only=True) as manager:
        topic = manager.topic(wordcount.SINK_TOPIC)
        return [
            (p, r.key or b"", r.value or b"")
            for p in range(topic.partitions)
            for r in manager.log(wordcount.SINK_TOPIC, p).records(0)
        ]


def _latest(records: list[tuple[int, bytes, bytes]]) -> dict[str, int]:
    return {key.decode(): int(value) for _, key, value in records}


def test_word_count_pipeline_counts_across_runs(spark: Any, tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    checkpoint = tmp_path / "checkpoint"
    wordcount.ensure_topics(log_dir, partitions=2)
    first = ["the quick brown fox", "jumps over the lazy dog", "", "  the   end  "]
    _append_lines(log_dir, first)

    def run() -> None:
        query = wordcount.start(spark, str(log_dir), str(checkpoint), available_now=True)
        query.awaitTermination(180)
        assert query.exception() is None

    # The pipeline reads the lines' values alone (a projection), as strings.
    plan = wordcount.word_counts(spark, str(log_dir))._jdf.queryExecution().analyzed().toString()
    assert re.search(r"StreamingRelationV2 .*, seglog, .*, \[value#\d+\], name=", plan), plan
    assert "split(value#" in plan  # a string already: no cast

    run()
    expected = Counter(word for line in first for word in line.split())
    after_first = _count_records(log_dir)
    assert _latest(after_first) == expected
    # Keyed by word as Kafka's producer would partition it.
    assert all(p == partition_for_key(key, 2) for p, key, _ in after_first)

    second = ["the fox again", "a new word"]
    _append_lines(log_dir, second)
    run()
    records = _count_records(log_dir)
    expected.update(word for line in second for word in line.split())
    assert _latest(records) == expected
    # The second run resumed the state and the offsets: it appended exactly one
    # updated count per word it saw, and none of the first run's counts again.
    first_run = Counter(p for p, _, _ in after_first)
    appended = [
        record for p in (0, 1) for record in [r for r in records if r[0] == p][first_run[p] :]
    ]
    assert [r for r in records if r not in appended] == after_first
    assert Counter(key.decode() for _, key, _ in appended) == Counter(
        {word: 1 for line in second for word in line.split()}
    )


def test_counts_read_as_word_tab_count(
    log_dir: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    """The output topic is created with a tab as its key separator (#23 item 7), so a
    partition file and ``seglogfs consume`` show ``word<TAB>count``, not bare counts."""
    wordcount.ensure_topics(log_dir)
    with LogManager.open(log_dir) as manager:
        assert manager.topic(wordcount.SINK_TOPIC).key_separator == "\t"
        assert manager.topic(wordcount.SOURCE_TOPIC).key_separator is None
        manager.log(wordcount.SINK_TOPIC, 0).append([b"2", b"1"], keys=[b"fox", b"dog"])
    assert cli_main(["consume", wordcount.SINK_TOPIC, "-d", str(log_dir)]) == 0
    assert capsysbinary.readouterr().out == b"fox\t2\ndog\t1\n"


@pytest.mark.trio
async def test_through_a_daemon_the_separator_is_the_same(log_dir: Path) -> None:
    with LogManager.open(log_dir) as manager:
        async with serving(log_dir, manager):
            await call(wordcount.ensure_topics, log_dir)
        assert manager.topic(wordcount.SINK_TOPIC).key_separator == "\t"
