"""DescribeConfigs (32), AlterConfigs (33) and IncrementalAlterConfigs (44): topic
configs under Kafka's topic-level names, over ``LogManager``.

Each topic config is described with its effective value and its source, as Kafka
names them: ``DYNAMIC_TOPIC_CONFIG`` (a topic override), ``STATIC_BROKER_CONFIG`` (the
directory's ``server.properties`` default differs from Kafka's) or ``DEFAULT_CONFIG``;
with ``include_synonyms`` the entry lists itself as its one synonym (the broker-level
names are not listed). Broker resources are refused with ``INVALID_REQUEST``: the
broker's settings are the daemon's ``--config`` file, read at start. AlterConfigs
replaces a topic's overrides with the ones given (as Kafka's does);
IncrementalAlterConfigs sets, deletes, appends to or subtracts from them
(``APPEND``/``SUBTRACT`` on list configs: ``cleanup.policy``). A bad key or value is
``INVALID_CONFIG`` and changes nothing; ``validate_only`` checks without writing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Final

from storage import ConfigError, LogConfig, LogManager, StorageError

from .broker import Broker, error_code_of
from .codec import ErrorCode, Request, build, response_class

__all__ = [
    "handle_alter_configs",
    "handle_describe_configs",
    "handle_incremental_alter_configs",
    "topic_config_entries",
]

TOPIC: Final = 2
BROKER: Final = 4

DYNAMIC_TOPIC_CONFIG: Final = 1
STATIC_BROKER_CONFIG: Final = 4
DEFAULT_CONFIG: Final = 5

# ConfigType of DescribeConfigs v3+ (Kafka's ConfigDef.Type ids).
_BOOLEAN, _STRING, _INT, _LONG, _DOUBLE, _LIST = 1, 2, 3, 5, 6, 7
_INT_KEYS: Final = frozenset(
    {"segment.bytes", "segment.index.bytes", "index.interval.bytes", "max.message.bytes"}
)

SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3


def _response(request: Request, **values: Any) -> Any:
    cls = response_class(request.api_key, request.api_version)
    assert cls is not None
    return build(cls, throttle_time=0, **values)


def _config_type(name: str, value: object) -> int:
    if isinstance(value, bool):
        return _BOOLEAN
    if isinstance(value, tuple):
        return _LIST
    if isinstance(value, float):
        return _DOUBLE
    if isinstance(value, int):
        return _INT if name in _INT_KEYS else _LONG
    return _STRING


def topic_config_entries(
    manager: LogManager,
    config: LogConfig,
    overrides: Mapping[str, str],
    keys: list[str] | None,
) -> list[dict[str, Any]]:
    """The config entries of a topic (``keys`` only, when given), each with its name,
    value, source and type."""
    values = config.to_properties()
    broker_default = manager.broker_config.default_topic_config.to_properties()
    kafka_default = LogConfig().to_properties()
    typed = {f.name.replace("_", "."): getattr(config, f.name) for f in dataclasses.fields(config)}
    entries = []
    for name, value in values.items():
        if keys is not None and name not in keys:
            continue
        if name in overrides:
            source = DYNAMIC_TOPIC_CONFIG
        elif broker_default[name] != kafka_default[name]:
            source = STATIC_BROKER_CONFIG
        else:
            source = DEFAULT_CONFIG
        entries.append(
            {
                "name": name,
                "value": value,
                "config_source": source,
                "config_type": _config_type(name, typed.get(name)),
            }
        )
    return entries


# -- DescribeConfigs ---------------------------------------------------------------------


async def handle_describe_configs(broker: Broker, request: Request) -> Any:
    """Answer DescribeConfigs."""
    body = request.body
    wanted = [
        (
            r.resource_type,
            r.resource_name,
            None if r.configuration_keys is None else list(r.configuration_keys),
        )
        for r in body.resources
    ]
    results = await broker.run_sync(
        _describe_configs, broker.manager, wanted, bool(getattr(body, "include_synonyms", False))
    )
    return _response(request, results=results)


def _describe_configs(
    manager: LogManager, wanted: list[tuple[int, str, list[str] | None]], synonyms: bool
) -> list[dict[str, Any]]:
    results = []
    for resource_type, name, keys in wanted:
        result: dict[str, Any] = {
            "error_code": ErrorCode.none,
            "error_message": None,
            "resource_type": resource_type,
            "resource_name": name,
            "configs": [],
        }
        results.append(result)
        if resource_type != TOPIC:
            result.update(
                error_code=ErrorCode.invalid_request,
                error_message="Only topic configs are described (the broker's: --config).",
            )
            continue
        try:
            overrides = manager.topic(name).overrides
            config = manager.topic_config(name)
        except (StorageError, OSError) as exc:
            result.update(error_code=error_code_of(exc), error_message=str(exc))
            continue
        result["configs"] = [
            {
                "name": e["name"],
                "value": e["value"],
                "read_only": False,
                "config_source": e["config_source"],
                "is_sensitive": False,
                "synonyms": (
                    [{"name": e["name"], "value": e["value"], "source": e["config_source"]}]
                    if synonyms
                    else []
                ),
                "config_type": e["config_type"],
                "documentation": None,
            }
            for e in topic_config_entries(manager, config, overrides, keys)
        ]
    return results


# -- AlterConfigs and IncrementalAlterConfigs ----------------------------------------------


async def handle_alter_configs(broker: Broker, request: Request) -> Any:
    """Answer AlterConfigs: each topic's overrides become the ones given."""
    body = request.body
    wanted = [
        (
            r.resource_type,
            r.resource_name,
            [(c.name, SET, c.value) for c in r.configs],
            True,
        )
        for r in body.resources
    ]
    results = await broker.run_sync(_alter, broker.manager, wanted, body.validate_only)
    return _response(request, responses=results)


async def handle_incremental_alter_configs(broker: Broker, request: Request) -> Any:
    """Answer IncrementalAlterConfigs."""
    body = request.body
    wanted = [
        (
            r.resource_type,
            r.resource_name,
            [(c.name, c.config_operation, c.value) for c in r.configs],
            False,
        )
        for r in body.resources
    ]
    results = await broker.run_sync(_alter, broker.manager, wanted, body.validate_only)
    return _response(request, responses=results)


def _alter(
    manager: LogManager,
    wanted: list[tuple[int, str, list[tuple[str, int, str | None]], bool]],
    validate_only: bool,
) -> list[dict[str, Any]]:
    """Each resource's outcome (blocking: a worker thread)."""
    results = []
    for resource_type, name, ops, replace in wanted:
        result: dict[str, Any] = {
            "error_code": ErrorCode.none,
            "error_message": None,
            "resource_type": resource_type,
            "resource_name": name,
        }
        results.append(result)
        if resource_type != TOPIC:
            result.update(
                error_code=ErrorCode.invalid_request,
                error_message="Only topic configs are altered (the broker's: --config).",
            )
            continue
        try:
            current = dict(manager.topic(name).overrides)
            effective = manager.topic_config(name).to_properties()
            wanted_overrides = {} if replace else dict(current)
            for key, op, value in ops:
                _apply(wanted_overrides, effective, key, op, value)
            # Checked as a whole before anything is written.
            manager.broker_config.topic_log_config(wanted_overrides)
            if not validate_only:
                deleted = [k for k in current if k not in wanted_overrides]
                changed = {k: v for k, v in wanted_overrides.items() if current.get(k) != v}
                if changed or deleted:
                    manager.alter_topic_config(name, changed, deleted)
        except ConfigError as exc:
            result.update(error_code=ErrorCode.invalid_config, error_message=str(exc))
        except (StorageError, OSError) as exc:
            result.update(error_code=error_code_of(exc), error_message=str(exc))
    return results


def _apply(
    overrides: dict[str, str], effective: dict[str, str], key: str, op: int, value: str | None
) -> None:
    """One IncrementalAlterConfigs operation on ``overrides``.

    Raises:
        ConfigError: an unknown operation, a list operation on a key that is no list, or
            a missing value.
    """
    if key not in effective:
        raise ConfigError(key, value, "unknown topic config")
    if op == DELETE:
        overrides.pop(key, None)
        return
    if value is None:
        raise ConfigError(key, value, "a value is needed")
    if op == SET:
        overrides[key] = value
        return
    if op not in (APPEND, SUBTRACT):
        raise ConfigError(key, op, "unknown operation")
    if key != "cleanup.policy":
        raise ConfigError(key, value, "APPEND and SUBTRACT apply to list configs only")
    items = [i for i in overrides.get(key, effective[key]).split(",") if i]
    given = [i.strip() for i in value.split(",") if i.strip()]
    if op == APPEND:
        items += [i for i in given if i not in items]
    else:
        items = [i for i in items if i not in given]
    overrides[key] = ",".join(items)
