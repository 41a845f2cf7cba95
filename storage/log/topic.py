"""Topic metadata: what Kafka keeps in its controller, kept here in the log directory.

A topic has a partition count, seglogfs' fixed rendering (``format`` and
``key.separator``, chosen at creation, never changed), and topic-level config
overrides. All topics live in one JSON file, ``seglog-topics.json``, replaced
atomically. The file is optional: topics found only as partition directories (a copy
of a Kafka broker's log directory) get the defaults.

Layout (version 1)::

    {"version": 1,
     "topics": {"<name>": {"partitions": 3, "format": "lines", "key.separator": null,
                           "config": {"retention.ms": "86400000"}}, ...},
     "deleting": ["<name>", ...]}

``deleting`` (optional, absent when empty) names deleted topics whose partition
directories may still exist: the metadata file is a topic deletion's commit point, and
this list is what keeps the directories left behind by a crash or a failed rename from
being taken for a topic a Kafka broker made (see ``LogManager.delete_topic``). Readers
that predate it ignore the key.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TypeVar

from ..atomic_file import write_atomically
from ..errors import ConfigError, InvalidTopicError, StorageError
from ..number import INT_MAX, abbreviated, shown_integer
from .file_names import METADATA_TOPIC

MAX_TOPIC_NAME_LENGTH = 249
_LONGEST_SHOWN_NAME = 255  # a file name's most: a longer name is shortened in the error
_LEGAL_TOPIC_CHARS = re.compile(r"[a-zA-Z0-9._-]+")
FORMATS = ("lines", "raw", "json")
_FILE_VERSION = 1


def validate_topic_name(name: str) -> None:
    """Apply Kafka's topic-name rules.

    They are also what keeps every topic inside the log directory: a partition
    directory is ``<name>-<partition>``, so a name may hold no ``/``, NUL or other
    byte a path gives meaning to, must not be ``.`` or ``..``, and at 249 characters
    its directory names fit a file name; only ASCII, so no two names look alike
    (``orders`` spelt with a Cyrillic o, U+043E, is refused). A name over 255 characters is
    shortened in the error (its ``name`` too): a client may send a megabyte of it.

    Raises:
        InvalidTopicError: empty, ``.`` or ``..``, over 249 characters, or a character
            outside ``[a-zA-Z0-9._-]``.
    """
    if not name:
        raise InvalidTopicError(name, "the name is empty")
    if name in (".", ".."):
        raise InvalidTopicError(name, "'.' and '..' are not allowed")
    shown = abbreviated(name) if len(name) > _LONGEST_SHOWN_NAME else name
    if len(name) > MAX_TOPIC_NAME_LENGTH:
        raise InvalidTopicError(shown, f"longer than {MAX_TOPIC_NAME_LENGTH} characters")
    if not _LEGAL_TOPIC_CHARS.fullmatch(name):
        raise InvalidTopicError(shown, "only ASCII letters, digits, '.', '_' and '-' are allowed")


def validate_new_topic_name(name: str) -> None:
    """``validate_topic_name``, and the names Kafka refuses to create although they
    are legal: ``__cluster_metadata``, whose ``__cluster_metadata-0`` is a KRaft
    broker's metadata log (Kafka: "Creation of internal topic __cluster_metadata is
    prohibited"), which this engine's loader, like Kafka's, never reads as a topic.

    Raises:
        InvalidTopicError: as ``validate_topic_name``, or a reserved name.
    """
    validate_topic_name(name)
    if name == METADATA_TOPIC:
        raise InvalidTopicError(name, f"creation of internal topic {name} is prohibited")


def collision_key(name: str) -> str:
    """Kafka refuses two topics that differ only by '.' versus '_' (metric names collide)."""
    return name.replace(".", "_")


@dataclass(frozen=True)
class TopicMetadata:
    """One topic's fixed facts and its config overrides (topic-level Kafka names).

    Raises:
        InvalidTopicError: (on construction) a name that breaks Kafka's rules.
        ConfigError: (on construction) a partition count that is no whole number from
            1 to Kafka's INT maximum, an unknown format, or a bad separator.
    """

    name: str
    partitions: int
    format: str = "lines"
    key_separator: str | None = None
    overrides: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        validate_topic_name(self.name)
        if not isinstance(self.partitions, int) or isinstance(self.partitions, bool):
            raise ConfigError("partitions", self.partitions, "must be a whole number")
        if self.partitions < 1:
            raise ConfigError("partitions", shown_integer(self.partitions), "must be at least 1")
        if self.partitions > INT_MAX:
            # Kafka's partition count is an INT; a creation never gets this far (see
            # BrokerConfig.validated_partition_count), a hand-edited file may.
            raise ConfigError(
                "partitions", shown_integer(self.partitions), "Not a number of type INT"
            )
        if self.format not in FORMATS:
            raise ConfigError("format", self.format, f"must be one of {', '.join(FORMATS)}")
        if self.key_separator is not None:
            if self.format != "lines":
                raise ConfigError("key.separator", self.key_separator, "only for format lines")
            if not self.key_separator or "\n" in self.key_separator:
                raise ConfigError(
                    "key.separator", self.key_separator, "must be non-empty, without newline"
                )

    def with_overrides(self, overrides: Mapping[str, str]) -> TopicMetadata:
        return replace(self, overrides=dict(overrides))

    def to_json(self) -> dict[str, object]:
        return {
            "partitions": self.partitions,
            "format": self.format,
            "key.separator": self.key_separator,
            "config": dict(sorted(self.overrides.items())),
        }


@dataclass(frozen=True)
class TopicsDocument:
    """What the metadata file records: the topics, and the deleted topics whose
    partition directories may remain (never one of ``topics``)."""

    topics: dict[str, TopicMetadata]
    deleting: frozenset[str] = frozenset()


def read_topics_file(path: Path) -> dict[str, TopicMetadata]:
    """All topics recorded in ``path``; an absent file records none.

    Raises:
        StorageError: the file is not what ``write_topics_file`` writes.
    """
    return read_topics_document(path).topics


def read_topics_document(path: Path) -> TopicsDocument:
    """The topics and the deletions in progress recorded in ``path`` (none when absent).

    Raises:
        StorageError: the file is not what ``write_topics_file`` writes.
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return TopicsDocument({})
    try:
        document = json.loads(data.decode("utf-8"))
        if not isinstance(document, dict) or document.get("version") != _FILE_VERSION:
            raise ValueError("not a version 1 topic metadata document")
        topics = {}
        for name, entry in _typed(document, "topics", dict).items():
            separator = entry.get("key.separator")
            if separator is not None and not isinstance(separator, str):
                raise ValueError(f"topic {name}: key.separator must be a string or null")
            overrides = _typed(entry, "config", dict, default={})
            if not all(isinstance(v, str) for v in overrides.values()):
                raise ValueError(f"topic {name}: config values must be strings")
            topics[name] = TopicMetadata(
                name=name,
                partitions=_typed(entry, "partitions", int),
                format=_typed(entry, "format", str, default="lines"),
                key_separator=separator,
                overrides=overrides,
            )
        deleting = _typed(document, "deleting", list, default=[])
        if not all(isinstance(name, str) for name in deleting):
            raise ValueError("'deleting' must list topic names")
        for name in deleting:
            validate_topic_name(name)
        # A name both live and deleting is live: its directories are never removed.
        return TopicsDocument(topics, frozenset(n for n in deleting if n not in topics))
    except (ValueError, TypeError, AttributeError, StorageError) as exc:
        raise StorageError(f"malformed topic metadata file {path}: {exc}") from exc


_T = TypeVar("_T")


def _typed(entry: object, key: str, kind: type[_T], default: _T | None = None) -> _T:
    # JSON's bool is an int to Python, and int(2.5) is 2: check, never convert.
    if not isinstance(entry, dict):
        raise ValueError(f"expected an object holding {key!r}")
    value = entry.get(key, default)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ValueError(f"{key!r} must be a {kind.__name__}, not {value!r}")
    return value


def write_topics_file(
    path: Path, topics: Mapping[str, TopicMetadata], deleting: Iterable[str] = ()
) -> None:
    """Replace ``path`` atomically with every topic's metadata and the names of the
    deleted topics whose directories may remain (``deleting``).

    Raises:
        OSError: the write failed; ``path`` keeps its previous content.
    """
    document: dict[str, object] = {
        "version": _FILE_VERSION,
        "topics": {name: topics[name].to_json() for name in sorted(topics)},
    }
    pending = sorted(set(deleting) - topics.keys())
    if pending:
        document["deleting"] = pending
    write_atomically(path, (json.dumps(document, indent=2) + "\n").encode("utf-8"))
