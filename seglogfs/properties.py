"""Settings read from a ``server.properties`` file (``--config``) by the faces.

The engine parses its own (``BrokerConfig``, ``GroupConfig``); the daemon's listeners
(``/metrics``, the Kafka listener) read a few more keys with the same rules: a whole
number within bounds, else a ``ConfigError`` naming the key (exit 2 at mount).
"""

from __future__ import annotations

from collections.abc import Mapping

from storage import ConfigError
from storage.number import INT_MAX

__all__ = ["bounded_int"]


def bounded_int(
    properties: Mapping[str, str], key: str, default: int, low: int, high: int = INT_MAX
) -> int:
    """``properties[key]`` as a whole number in ``[low, high]``; ``default`` when unset.

    Raises:
        ConfigError: the value is no whole number or is out of bounds.
    """
    raw = properties.get(key)
    if raw is None:
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise ConfigError(key, raw, "must be a whole number") from None
    if not low <= value <= high:
        raise ConfigError(key, raw, f"must be a whole number from {low} to {high}")
    return value
