"""The admin calls the command line makes itself, or asks the daemon for, and the file
system makes: one function each, so that the rules and the results are the same
whichever face runs them.

- ``require_keys_for_compaction``: a ``lines`` topic whose ``cleanup.policy`` has
  ``compact`` needs a ``key.separator``. A compacted topic refuses a record without a
  key (Kafka's ``LogValidator``), and without a separator every line written to the
  topic's files (``echo >>``, ``seglogfs produce``) is such a record: the topic could
  take nothing through the file system. So its creation, a config change that makes
  it compacted, and a rendering change that drops its separator are refused
  (``ConfigError``: exit 2 on the command line, ``EINVAL`` through the mount). A
  ``raw`` topic may be compacted (its files' writes are keyless and are refused one by
  one, ``EINVAL``; Kafka clients produce keyed records to it), and so may a ``json``
  one (its lines carry their keys). Topics created by Kafka clients
  (``CreateTopics``) are not held to it: their producers bring keys.
- ``create_topic``, ``alter_topic_config``: the engine's calls with that rule first.
- ``clean``: ``LogManager.clean``, one call at a time in the process (``CLEANING``):
  the daemon's background pass and a ``seglogfs compact`` request never run at once,
  since a log that one of them is cleaning is left out of the other's pass without a
  word (``LogCleanerManager.logs_to_clean``).
- ``compact``: what ``seglogfs compact`` runs, with or without a daemon: a forced
  pass until clean over the named topics (all compacted topics when none is named),
  its result as the JSON the ``compact`` op returns.

The rule's check and the change it guards run under ``TOPIC_RULES``: two requests
racing to set a topic's policy (control socket, ``setfattr``) and its rendering
(``setfattr``) would otherwise both pass their checks and leave a compacted ``lines``
topic without a separator. (The engine's own lock is not held between the two steps,
hence one here; each process that writes a log directory holds its lock, so one
process's lock is enough.)

Thread-safety: every function may be called from any thread; ``clean`` and ``compact``
wait for one another (``CLEANING``). Blocking: engine calls; call them from a worker
thread in the daemon.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Final

from storage import CleanSummary, ConfigError, LogConfig, LogManager, TopicMetadata

__all__ = [
    "CLEANING",
    "DEFAULT_FORMAT",
    "TOPIC_RULES",
    "alter_topic_config",
    "clean",
    "compact",
    "create_topic",
    "require_keys_for_compaction",
    "set_topic_rendering",
    "summary_result",
]

DEFAULT_FORMAT: Final = "lines"
"""The format of a topic created without one by a manager opened without
``default_format`` (``LogManager.open``'s default): the command line's."""

CLEANING: Final = threading.Lock()
"""Held by each ``clean`` (and ``compact``) call in this process."""

TOPIC_RULES: Final = threading.Lock()
"""Held across ``require_keys_for_compaction`` and the change it allows (see the
module). Taken in worker threads only: never across an ``await``."""

ProgressHook = Callable[[int, int], object]
"""``progress(done_bytes, total_bytes)``: told before the first topic and after each."""


def require_keys_for_compaction(
    config: LogConfig,
    format: str,
    key_separator: str | None,
    *,
    key: str = "cleanup.policy",
    value: object = None,
) -> None:
    """Refuse a topic that would be compacted (``config``) and rendered as ``lines``
    without a ``key.separator`` (see the module). ``key`` and ``value`` name the change
    being made, for the message (default: the policy).

    Raises:
        ConfigError: naming ``key`` and ``value``.
    """
    if not config.compact or format != "lines" or key_separator is not None:
        return
    if value is None and key == "cleanup.policy":
        value = ",".join(config.cleanup_policy)
    raise ConfigError(
        key,
        value,
        "a lines topic with cleanup.policy compact needs a key.separator: a compacted "
        "topic refuses records without a key, and lines without a separator have none "
        "(set key.separator first, or use format json or raw)",
    )


def create_topic(
    manager: LogManager,
    name: str,
    partitions: int | None = None,
    config: Mapping[str, str] | None = None,
    *,
    format: str | None = None,
    key_separator: str | None = None,
) -> TopicMetadata:
    """``LogManager.create_topic`` (``format`` None: the manager's default format),
    refusing a compacted ``lines`` topic without a separator first.

    Raises:
        ConfigError: that rule, or as ``LogManager.create_topic``; nothing is created.
        StorageError, OSError: as ``LogManager.create_topic``.
    """
    overrides = dict(config or {})
    require_keys_for_compaction(
        manager.broker_config.topic_log_config(overrides),
        format or manager.default_format,
        key_separator,
    )
    return manager.create_topic(
        name, partitions, overrides, format=format, key_separator=key_separator
    )


def alter_topic_config(
    manager: LogManager,
    name: str,
    set_configs: Mapping[str, str] | None = None,
    delete_configs: Iterable[str] = (),
) -> LogConfig:
    """``LogManager.alter_topic_config``, refusing a change that makes a ``lines``
    topic without a separator compacted (setting ``cleanup.policy``, or removing an
    override so that the broker's ``log.cleanup.policy`` applies).

    Raises:
        UnknownTopicError: no such topic.
        ConfigError: that rule, an unknown key or a bad value; nothing is changed.
        ReadOnlyLogError: the manager is read-only.
    """
    to_delete = list(delete_configs)
    with TOPIC_RULES:
        metadata = manager.topic(name)
        overrides = {k: v for k, v in metadata.overrides.items() if k not in to_delete}
        overrides.update(set_configs or {})
        try:
            after = manager.broker_config.topic_log_config(overrides)
        except ConfigError:
            after = None  # the engine's own error, below, names it
        # Only a change that makes the topic compacted is refused: one that was already
        # (made by a Kafka client, or compacted by a broker default changed since) keeps
        # taking its other settings.
        if after is not None and not manager.topic_config(name).compact:
            require_keys_for_compaction(after, metadata.format, metadata.key_separator)
        return manager.alter_topic_config(name, set_configs, to_delete)


def set_topic_rendering(
    manager: LogManager,
    name: str,
    format: str,
    key_separator: str | None,
    *,
    key: str,
    value: str,
) -> TopicMetadata:
    """``LogManager.set_topic_rendering``, refusing a rendering that leaves a compacted
    topic's lines without keys (``key``/``value``: the change as asked, for the
    message).

    Raises:
        ConfigError: that rule or a bad rendering; nothing is changed.
        As ``LogManager.set_topic_rendering`` (``TopicNotEmptyError``, ...).
    """
    with TOPIC_RULES:
        require_keys_for_compaction(
            manager.topic_config(name), format, key_separator, key=key, value=value
        )
        return manager.set_topic_rendering(name, format, key_separator)


def clean(
    manager: LogManager,
    topics: Iterable[str] | None = None,
    *,
    force: bool = False,
    until_clean: bool = False,
) -> CleanSummary:
    """``LogManager.clean`` while holding ``CLEANING`` (see the module).

    Raises:
        As ``LogManager.clean``.
    """
    with CLEANING:
        return manager.clean(topics, force=force, until_clean=until_clean)


def compact(
    manager: LogManager,
    topics: Sequence[str] = (),
    progress: ProgressHook | None = None,
) -> dict[str, object]:
    """What ``seglogfs compact`` asks: a forced cleaning pass, repeated until clean,
    over every log of ``topics`` (none: of every topic whose policy has ``compact``),
    one topic at a time, holding ``CLEANING`` throughout; ``summary_result`` of what
    it did. A named topic whose policy has no ``compact`` is in ``skipped``, with the
    logs whose pass failed.

    Cost: as ``LogManager.clean`` per topic; ``progress`` is told the bytes of the
    topics done so far against those of all the topics.

    Raises:
        UnknownTopicError: a named topic does not exist (checked before any pass).
        ReadOnlyLogError: the manager is read-only or closed.
        OSError: a cleaned segment or the checkpoint could not be written (the passes
            before it stay done).
    """
    names = list(dict.fromkeys(topics))
    for name in names:
        manager.topic(name)  # UnknownTopicError before anything is cleaned
    if not names:
        names = [name for name in manager.topics() if manager.topic_config(name).compact]
    with CLEANING:
        sizes = {
            name: sum(manager.log(name, p).size for p in range(manager.topic(name).partitions))
            for name in names
        }
        total = sum(sizes.values())
        done = 0
        if progress is not None:
            progress(done, total)
        parts: list[CleanSummary] = []
        for name in names:
            parts.append(manager.clean([name], force=True, until_clean=True))
            done += sizes[name]
            if progress is not None:
                progress(done, total)
    return summary_result(
        CleanSummary(
            tuple(r for part in parts for r in part.cleaned),
            tuple(s for part in parts for s in part.skipped),
        )
    )


def summary_result(summary: CleanSummary) -> dict[str, object]:
    """A ``CleanSummary`` as JSON: ``{"cleaned": [LogCleanResult's fields, ...],
    "skipped": [{"topic", "partition", "reason"}, ...]}``."""
    return {
        "cleaned": [dataclasses.asdict(result) for result in summary.cleaned],
        "skipped": [
            {"topic": topic, "partition": partition, "reason": reason}
            for topic, partition, reason in summary.skipped
        ],
    }
