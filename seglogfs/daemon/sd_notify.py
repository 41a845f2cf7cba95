"""systemd's notify protocol without a dependency: ``READY=1``, ``STOPPING=1``,
``WATCHDOG=1`` as datagrams to ``$NOTIFY_SOCKET``.

The protocol (``sd_notify(3)``): newline-separated ``KEY=VALUE`` assignments in one
datagram to the ``AF_UNIX`` socket named by ``NOTIFY_SOCKET``; a name starting with
``@`` is in the abstract namespace. ``WATCHDOG_USEC`` (and ``WATCHDOG_PID``, when set,
naming this process) asks for ``WATCHDOG=1`` more often than every that many
microseconds; ``watchdog_interval`` gives half of it, as ``sd_watchdog_enabled(3)``
recommends.

Without ``NOTIFY_SOCKET`` (not run by systemd) every call does nothing. Thread-safe: each
call opens its own socket.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

__all__ = ["notify", "watchdog_interval"]


def _address(name: str) -> str | bytes:
    # '@name' is Linux's abstract namespace: a leading NUL byte instead of '@'.
    if name.startswith("@"):
        return b"\0" + name[1:].encode()
    return name


def notify(state: str, environ: Mapping[str, str] | None = None) -> bool:
    """Send ``state`` (e.g. ``"READY=1"``) to systemd; return whether it was sent.

    Returns False when ``NOTIFY_SOCKET`` is unset. Never raises for a missing or
    refusing socket (systemd gone is not the daemon's failure): returns False.
    """
    env = os.environ if environ is None else environ
    name = env.get("NOTIFY_SOCKET")
    if not name:
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(_address(name))
            sock.sendall(state.encode())
    except OSError:
        return False
    return True


def watchdog_interval(environ: Mapping[str, str] | None = None) -> float | None:
    """Seconds between ``WATCHDOG=1`` pings (half of ``WATCHDOG_USEC``), or ``None``
    when no watchdog is asked of this process."""
    env = os.environ if environ is None else environ
    usec = env.get("WATCHDOG_USEC")
    if not usec or not env.get("NOTIFY_SOCKET"):
        return None
    pid = env.get("WATCHDOG_PID")
    if pid and pid.strip() != str(os.getpid()):
        return None
    try:
        value = int(usec)
    except ValueError:
        return None
    if value <= 0:
        return None
    return value / 2_000_000
