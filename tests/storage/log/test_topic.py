"""Topic names (Kafka's rules), topic metadata, and the topics file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from storage.errors import ConfigError, InvalidTopicError, StorageError
from storage.log.topic import (
    MAX_TOPIC_NAME_LENGTH,
    TopicMetadata,
    TopicsDocument,
    collision_key,
    read_topics_document,
    read_topics_file,
    validate_topic_name,
    write_topics_file,
)


@pytest.mark.parametrize(
    "name",
    [
        "orders",
        "a",
        "A-Z_a-z.0-9",
        "__consumer_offsets",
        "...",
        ".hidden",
        "-",
        "x" * MAX_TOPIC_NAME_LENGTH,
    ],
)
def test_legal_topic_names_are_accepted(name: str) -> None:
    validate_topic_name(name)


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("", "empty"),
        (".", "'.' and '..'"),
        ("..", "'.' and '..'"),
        ("x" * (MAX_TOPIC_NAME_LENGTH + 1), "longer than 249"),
        ("a/b", "only ASCII"),
        ("a b", "only ASCII"),
        ("caf\u00e9", "only ASCII"),
        ("\uff41", "only ASCII"),  # fullwidth 'a'
        ("a\\b", "only ASCII"),
        ("a:b", "only ASCII"),
        ("a\tb", "only ASCII"),
        ("a\nb", "only ASCII"),
        ("\x00", "only ASCII"),
    ],
)
def test_illegal_topic_names_are_rejected_with_the_reason(name: str, reason: str) -> None:
    with pytest.raises(InvalidTopicError, match=reason) as info:
        validate_topic_name(name)
    assert info.value.name == name


def test_max_topic_name_length_is_kafkas() -> None:
    assert MAX_TOPIC_NAME_LENGTH == 249


def test_a_trailing_newline_is_rejected() -> None:
    with pytest.raises(InvalidTopicError):
        validate_topic_name("orders\n")


def test_collision_key_equates_dot_and_underscore() -> None:
    assert collision_key("a.b_c") == collision_key("a_b.c") == "a_b_c"
    assert collision_key("a.b") != collision_key("a-b")
    assert collision_key("plain") == "plain"


def test_metadata_defaults() -> None:
    meta = TopicMetadata("orders", 3)
    assert (meta.format, meta.key_separator, dict(meta.overrides)) == ("lines", None, {})


def test_metadata_validates_the_name() -> None:
    with pytest.raises(InvalidTopicError):
        TopicMetadata("a/b", 1)


@pytest.mark.parametrize("partitions", [0, -1])
def test_metadata_needs_at_least_one_partition(partitions: int) -> None:
    with pytest.raises(ConfigError) as info:
        TopicMetadata("orders", partitions)
    assert info.value.key == "partitions"


@pytest.mark.parametrize(
    "partitions",
    [
        pytest.param("3", id="str"),
        pytest.param(True, id="bool"),
        pytest.param(2.0, id="float"),
        pytest.param(2**31, id="over-int"),
        pytest.param(10**30, id="10**30"),
        pytest.param(10**5000, id="10**5000"),
        pytest.param(-(10**5000), id="-10**5000"),
    ],
)
def test_metadata_needs_a_whole_number_of_partitions_within_int(partitions: object) -> None:
    """Kafka's partition count is an INT. A str gave a TypeError, True passed as one
    partition, and 10**30 was written to the topics file (issue #18)."""
    with pytest.raises(ConfigError) as info:
        TopicMetadata("t", partitions)  # type: ignore[arg-type]
    assert info.value.key == "partitions"
    assert len(str(info.value)) < 200
    assert TopicMetadata("t", 2**31 - 1).partitions == 2**31 - 1


def test_metadata_rejects_an_unknown_format() -> None:
    with pytest.raises(ConfigError) as info:
        TopicMetadata("orders", 1, format="yaml")
    assert info.value.key == "format"
    TopicMetadata("orders", 1, format="raw")


@pytest.mark.parametrize(
    ("fmt", "separator"),
    [("raw", "|"), ("lines", ""), ("lines", "\n"), ("lines", "a\nb")],
)
def test_metadata_rejects_a_bad_key_separator(fmt: str, separator: str) -> None:
    with pytest.raises(ConfigError) as info:
        TopicMetadata("orders", 1, format=fmt, key_separator=separator)
    assert info.value.key == "key.separator"


@pytest.mark.parametrize("separator", ["|", "\t", " => ", "\u2192"])
def test_metadata_accepts_a_key_separator_for_lines(separator: str) -> None:
    assert TopicMetadata("orders", 1, key_separator=separator).key_separator == separator


def test_with_overrides_replaces_them_and_keeps_the_rest() -> None:
    meta = TopicMetadata("orders", 2, key_separator="|", overrides={"retention.ms": "1"})
    updated = meta.with_overrides({"segment.bytes": "1000"})
    assert dict(updated.overrides) == {"segment.bytes": "1000"}
    assert (updated.name, updated.partitions, updated.key_separator) == ("orders", 2, "|")
    assert dict(meta.overrides) == {"retention.ms": "1"}


def test_topics_file_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "seglog-topics.json"
    topics = {
        "orders": TopicMetadata("orders", 3, key_separator="\t", overrides={"retention.ms": "5"}),
        "blobs": TopicMetadata("blobs", 1, format="raw"),
        "a.b_c": TopicMetadata(
            "a.b_c", 12, overrides={"segment.bytes": "1", "cleanup.policy": "x"}
        ),
    }
    write_topics_file(path, topics)
    assert read_topics_file(path) == topics
    assert not path.with_name(path.name + ".tmp").exists()
    document = json.loads(path.read_text(encoding="utf-8"))
    assert document["version"] == 1
    assert list(document["topics"]) == ["a.b_c", "blobs", "orders"]
    assert document["topics"]["orders"] == {
        "partitions": 3,
        "format": "lines",
        "key.separator": "\t",
        "config": {"retention.ms": "5"},
    }


def test_writing_topics_replaces_the_previous_file(tmp_path: Path) -> None:
    path = tmp_path / "seglog-topics.json"
    write_topics_file(path, {"a": TopicMetadata("a", 1), "b": TopicMetadata("b", 1)})
    write_topics_file(path, {"b": TopicMetadata("b", 4)})
    assert read_topics_file(path) == {"b": TopicMetadata("b", 4)}
    write_topics_file(path, {})
    assert read_topics_file(path) == {}


def test_a_missing_topics_file_records_no_topics(tmp_path: Path) -> None:
    assert read_topics_file(tmp_path / "absent.json") == {}


def test_optional_fields_take_their_defaults(tmp_path: Path) -> None:
    path = tmp_path / "seglog-topics.json"
    path.write_text(json.dumps({"version": 1, "topics": {"t": {"partitions": 2}}}))
    assert read_topics_file(path) == {"t": TopicMetadata("t", 2)}


def test_deletions_in_progress_are_recorded_beside_the_topics(tmp_path: Path) -> None:
    path = tmp_path / "seglog-topics.json"
    write_topics_file(path, {"a": TopicMetadata("a", 1)}, deleting=["gone", "a", "b.c"])
    # A live topic is never also being deleted: its directories must stay.
    assert json.loads(path.read_text())["deleting"] == ["b.c", "gone"]
    assert read_topics_document(path) == TopicsDocument(
        {"a": TopicMetadata("a", 1)}, frozenset({"gone", "b.c"})
    )
    assert read_topics_file(path) == {"a": TopicMetadata("a", 1)}
    write_topics_file(path, {"a": TopicMetadata("a", 1)})
    assert "deleting" not in json.loads(path.read_text())  # what older readers wrote
    assert read_topics_document(path).deleting == frozenset()
    path.write_text(
        json.dumps({"version": 1, "topics": {"a": {"partitions": 1}}, "deleting": ["a"]})
    )
    assert read_topics_document(path).deleting == frozenset()


def _document(**entry: object) -> object:
    return {"version": 1, "topics": {"t": {"partitions": 1, **entry}}}


@pytest.mark.parametrize(
    "content",
    [
        pytest.param("", id="empty"),
        pytest.param("{", id="truncated-json"),
        pytest.param("not json", id="not-json"),
        pytest.param(json.dumps([1, 2]), id="list-document"),
        pytest.param(json.dumps({"topics": {}}), id="no-version"),
        pytest.param(json.dumps({"version": 2, "topics": {}}), id="future-version"),
        pytest.param(json.dumps({"version": "1", "topics": {}}), id="string-version"),
        pytest.param(json.dumps({"version": 1}), id="no-topics"),
        pytest.param(json.dumps({"version": 1, "topics": []}), id="topics-list"),
        pytest.param(json.dumps({"version": 1, "topics": {"t": 3}}), id="entry-int"),
        pytest.param(json.dumps({"version": 1, "topics": {"t": {}}}), id="no-partitions"),
        pytest.param(json.dumps(_document(partitions="three")), id="partitions-word"),
        pytest.param(json.dumps(_document(partitions=None)), id="partitions-null"),
        pytest.param(json.dumps(_document(partitions=0)), id="partitions-zero"),
        # What a control-socket request wrote before counts were bounded (issue #18).
        pytest.param(json.dumps(_document(partitions=10**30)), id="partitions-10**30"),
        pytest.param(json.dumps(_document(partitions=2**31)), id="partitions-over-int"),
        pytest.param(
            '{"version": 1, "topics": {"t": {"partitions": 1%s}}}' % ("0" * 5000),
            id="partitions-5001-digits",
        ),
        pytest.param(json.dumps(_document(format="yaml")), id="unknown-format"),
        pytest.param(json.dumps(_document(format="raw", **{"key.separator": "|"})), id="raw-sep"),
        pytest.param(json.dumps(_document(**{"key.separator": 5})), id="separator-int"),
        pytest.param(json.dumps(_document(config=["a"])), id="config-list"),
        pytest.param(json.dumps({"version": 1, "topics": {"a/b": {"partitions": 1}}}), id="name"),
        pytest.param(json.dumps({"version": 1, "topics": {}, "deleting": "t"}), id="deleting-str"),
        pytest.param(json.dumps({"version": 1, "topics": {}, "deleting": [1]}), id="deleting-int"),
        pytest.param(json.dumps({"version": 1, "topics": {}, "deleting": ["a/b"]}), id="deleting"),
    ],
)
def test_a_malformed_topics_file_raises_storage_error_naming_it(
    tmp_path: Path, content: str
) -> None:
    path = tmp_path / "seglog-topics.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(StorageError, match="malformed topic metadata file") as info:
        read_topics_file(path)
    assert str(path) in str(info.value)


def test_a_topics_file_that_is_not_utf8_raises_storage_error(tmp_path: Path) -> None:
    path = tmp_path / "seglog-topics.json"
    path.write_bytes(b'{"version": 1, "topics": {"\xff": {"partitions": 1}}}')
    with pytest.raises(StorageError, match="malformed topic metadata file"):
        read_topics_file(path)


@pytest.mark.parametrize(
    "entry",
    [
        pytest.param({"partitions": 2.5}, id="partitions-float"),
        pytest.param({"partitions": True}, id="partitions-bool"),
        pytest.param({"partitions": 1, "key.separator": ["|"]}, id="separator-list"),
    ],
)
def test_wrong_json_types_raise_storage_error(tmp_path: Path, entry: dict[str, object]) -> None:
    path = tmp_path / "seglog-topics.json"
    path.write_text(json.dumps({"version": 1, "topics": {"t": entry}}), encoding="utf-8")
    with pytest.raises(StorageError, match="malformed topic metadata file"):
        read_topics_file(path)
