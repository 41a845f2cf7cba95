"""``seglogfs topics create|list|describe|alter|delete``: Kafka's ``kafka-topics.sh``.

When a daemon owns the log directory (its control socket answers), the changes go
through it (``seglogfs.control``) and give the same results and errors; ``list`` and
``describe`` open the files read-only and work while it writes. A ``lines`` topic whose
``cleanup.policy`` has ``compact`` needs ``--key-separator``: its creation, or an
``alter`` that makes it compacted, is refused otherwise (exit 2; see
``seglogfs.control.admin``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from storage import StorageError, TopicExistsError, UnknownTopicError
from storage.number import INT_MAX, INT_MIN, abbreviated, parse_java_integer

from .. import control
from ..control import admin
from .common import (
    EXIT_OK,
    Parents,
    Parser,
    UsageError,
    broker_config_of,
    existing_log_dir,
    log_dir_of,
    open_read_only,
    open_writable,
)

__all__ = ["add_parser"]


def _topic_name(args: argparse.Namespace) -> str:
    name: str | None = args.topic or args.topic_option
    if args.topic and args.topic_option and args.topic != args.topic_option:
        raise UsageError(f"two topics given: {args.topic!r} and --topic {args.topic_option!r}")
    if not name:
        raise UsageError("a topic is required")
    return name


def _partition_count(text: str) -> int:
    """``--partitions``, read as ``kafka-topics.sh`` reads it: a Java ``int`` (the
    engine then checks it against ``max.topic.partitions``)."""
    value = parse_java_integer(text, INT_MIN, INT_MAX)
    if value is None:
        # argparse's own wording for a bad int, with a value of 5,000 digits shortened.
        raise argparse.ArgumentTypeError(f"invalid int value: {abbreviated(text)!r}")
    return value


def _parse_config_pairs(pairs: Sequence[str] | None, option: str) -> dict[str, str]:
    config: dict[str, str] = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"{option} takes KEY=VALUE, not {pair!r}")
        config[key.strip()] = value
    return config


def _cmd_topics_create(args: argparse.Namespace) -> int:
    log_dir = log_dir_of(args)
    name = _topic_name(args)
    config = _parse_config_pairs(args.config, "--config")
    try:
        if control.daemon_socket(log_dir) is not None:
            control.request(
                log_dir,
                "create_topic",
                name=name,
                partitions=args.partitions,
                config=config,
                format=args.format,
                key_separator=args.key_separator,
            )
        else:
            broker = broker_config_of(log_dir, args)
            # What the engine checks first, checked before LogManager.open creates a
            # missing log directory: a refused request leaves nothing behind.
            if args.partitions is not None:
                broker.validated_partition_count(args.partitions)
            admin.require_keys_for_compaction(
                broker.topic_log_config(config),
                args.format or admin.DEFAULT_FORMAT,
                args.key_separator,
            )
            with open_writable(log_dir, args, broker) as manager:
                admin.create_topic(
                    manager,
                    name,
                    args.partitions,
                    config,
                    format=args.format,
                    key_separator=args.key_separator,
                )
    except (TopicExistsError, control.ControlError) as exc:
        if args.if_not_exists and _is_error(exc, TopicExistsError):
            return EXIT_OK  # as kafka-topics.sh --if-not-exists: quietly nothing to do
        raise
    print(f"Created topic {name}.")
    return EXIT_OK


def _is_error(exc: BaseException, kind: type[StorageError]) -> bool:
    """``exc`` is the engine's ``kind``, raised here or reported by the daemon."""
    if isinstance(exc, control.ControlError):
        return exc.kind == kind.__name__
    return isinstance(exc, kind)


def _cmd_topics_list(args: argparse.Namespace) -> int:
    with open_read_only(log_dir_of(args)) as manager:
        for name in manager.topics():
            print(name)
    return EXIT_OK


def _format_config(config: dict[str, str]) -> str:
    return ",".join(f"{key}={value}" for key, value in sorted(config.items()))


def _cmd_topics_describe(args: argparse.Namespace) -> int:
    wanted = args.topic or args.topic_option
    with open_read_only(log_dir_of(args)) as manager:
        names = [wanted] if wanted else manager.topics()
        for name in names:
            description = manager.describe_topic(name)
            metadata = description.metadata
            separator = metadata.key_separator if metadata.key_separator is not None else ""
            print(
                f"Topic: {name}\tPartitionCount: {metadata.partitions}\t"
                f"Format: {metadata.format}\tKeySeparator: {separator}\t"
                f"Configs: {_format_config(dict(metadata.overrides))}"
            )
            for p in description.partitions:
                print(
                    f"\tTopic: {name}\tPartition: {p.partition}\t"
                    f"StartOffset: {p.log_start_offset}\tEndOffset: {p.log_end_offset}\t"
                    f"Segments: {p.segment_count}\tSize: {p.size}\t"
                    f"FirstTimestamp: {p.first_timestamp}\tLastTimestamp: {p.last_timestamp}"
                )
    return EXIT_OK


def _cmd_topics_alter(args: argparse.Namespace) -> int:
    log_dir = existing_log_dir(args)
    name = _topic_name(args)
    to_set = _parse_config_pairs(args.add_config, "--add-config")
    to_delete = list(args.delete_config or ())
    if args.partitions is not None:
        if to_set or to_delete:
            # Two changes, each all or nothing: one command each, so that a refused
            # count never follows an applied config (or the other way round).
            raise UsageError(
                "--partitions cannot be combined with --add-config/--delete-config: "
                "run one command for each"
            )
        return _add_partitions(log_dir, name, args)
    if not to_set and not to_delete:
        raise UsageError(
            "nothing to alter: give --partitions, or --add-config and/or --delete-config"
        )
    try:
        if control.daemon_socket(log_dir) is not None:
            control.request(log_dir, "alter_topic", name=name, set=to_set, delete=to_delete)
        else:
            with open_writable(log_dir, args) as manager:
                admin.alter_topic_config(manager, name, to_set, to_delete)
    except (UnknownTopicError, control.ControlError) as exc:
        if args.if_exists and _is_error(exc, UnknownTopicError):
            return EXIT_OK
        raise
    print(f"Completed updating config for topic {name}.")
    return EXIT_OK


def _add_partitions(log_dir: Path, name: str, args: argparse.Namespace) -> int:
    """``topics alter --partitions N``: as ``kafka-topics.sh --alter --partitions``,
    increase only, and the same warning about keys."""
    count: int = args.partitions
    try:
        if control.daemon_socket(log_dir) is not None:
            control.request(log_dir, "add_partitions", name=name, partitions=count)
        else:
            with open_writable(log_dir, args) as manager:
                manager.add_partitions(name, count)
    except (UnknownTopicError, control.ControlError) as exc:
        if args.if_exists and _is_error(exc, UnknownTopicError):
            return EXIT_OK
        raise
    # The warning kafka-topics.sh printed for --alter --partitions (ZooKeeper era).
    print(
        "WARNING: If partitions are increased for a topic that has a key, the partition "
        "logic or ordering of the messages will be affected",
        file=sys.stderr,
    )
    print(f"Adding partitions succeeded! Topic {name} now has {count} partitions.")
    return EXIT_OK


def _cmd_topics_delete(args: argparse.Namespace) -> int:
    log_dir = log_dir_of(args)
    name = _topic_name(args)
    if args.if_exists and not log_dir.is_dir():
        return EXIT_OK
    log_dir = existing_log_dir(args)
    try:
        if control.daemon_socket(log_dir) is not None:
            control.request(log_dir, "delete_topic", name=name)
        else:
            with open_writable(log_dir, args) as manager:
                manager.delete_topic(name)
    except (UnknownTopicError, control.ControlError) as exc:
        if args.if_exists and _is_error(exc, UnknownTopicError):
            return EXIT_OK
        raise
    print(f"Deleted topic {name}.")
    return EXIT_OK


def add_parser(commands: argparse._SubParsersAction[Parser], shared: Parents) -> None:
    """Add ``topics`` and its actions to ``commands``."""
    topics = commands.add_parser(
        "topics",
        parents=[shared.log_dir],  # -d before the action too: topics -d DIR list
        help="create, list, describe, alter or delete topics (like kafka-topics.sh)",
    )
    actions = topics.add_subparsers(dest="action", metavar="ACTION", parser_class=Parser)
    actions.required = True

    def topic_arguments(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("topic", nargs="?", metavar="TOPIC", help="the topic name")
        sub.add_argument(
            "--topic", dest="topic_option", metavar="TOPIC", help="the topic name (alternative)"
        )

    create = actions.add_parser(
        "create", parents=[shared.log_dir, shared.writer], help="create a topic"
    )
    topic_arguments(create)
    create.add_argument(
        "--partitions",
        type=_partition_count,
        metavar="N",
        help="partition count (default num.partitions; at most max.topic.partitions, 1000)",
    )
    create.add_argument(
        "--config",
        action="append",
        metavar="KEY=VALUE",
        help="a topic config override, e.g. retention.ms=86400000 (repeatable)",
    )
    create.add_argument(
        "--format",
        choices=("lines", "raw", "json"),
        help="how partition files render records: one record a line, values back to back, "
        "or one JSON object a line (fixed once a record exists; default lines, or a "
        "running daemon's default_format)",
    )
    create.add_argument(
        "--key-separator", metavar="SEP", help="lines topics: text between key and value"
    )
    create.add_argument(
        "--if-not-exists", action="store_true", help="do nothing (exit 0) if the topic exists"
    )
    create.set_defaults(handler=_cmd_topics_create, command_parser=create)

    listing = actions.add_parser(
        "list", parents=[shared.log_dir], help="list topic names, one a line"
    )
    listing.set_defaults(handler=_cmd_topics_list, command_parser=listing)

    describe = actions.add_parser(
        "describe",
        parents=[shared.log_dir],
        help="partitions (start/end offsets, segments, size) and config overrides",
    )
    topic_arguments(describe)
    describe.set_defaults(handler=_cmd_topics_describe, command_parser=describe)

    alter = actions.add_parser(
        "alter",
        parents=[shared.log_dir, shared.writer],
        help="add partitions, or change config overrides",
    )
    topic_arguments(alter)
    alter.add_argument(
        "--partitions",
        type=_partition_count,
        metavar="N",
        help="raise the partition count to N (increase only, as Kafka; keyed records "
        "then map to murmur2(key) %% N, so a key's later records may go elsewhere)",
    )
    alter.add_argument(
        "--add-config", action="append", metavar="KEY=VALUE", help="set an override (repeatable)"
    )
    alter.add_argument(
        "--delete-config", action="append", metavar="KEY", help="remove an override (repeatable)"
    )
    alter.add_argument(
        "--if-exists", action="store_true", help="do nothing (exit 0) if there is no such topic"
    )
    alter.set_defaults(handler=_cmd_topics_alter, command_parser=alter)

    delete = actions.add_parser(
        "delete", parents=[shared.log_dir, shared.writer], help="delete a topic and its data"
    )
    topic_arguments(delete)
    delete.add_argument(
        "--if-exists", action="store_true", help="do nothing (exit 0) if there is no such topic"
    )
    delete.set_defaults(handler=_cmd_topics_delete, command_parser=delete)
