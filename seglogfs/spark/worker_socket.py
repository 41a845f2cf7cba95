"""No Nagle / delayed-ACK stalls on a Spark Python worker's TCP connection to its JVM.

Spark's JVM talks to its Python workers over loopback TCP (Unix sockets only with
``spark.python.unix.domain.socket.enabled``, Spark 4.1+, off by default). Neither side
turns Nagle's algorithm off, and a request/response connection makes Linux delay its
ACKs (up to 40 ms, until there is data to carry them). Two stalls follow, each ~44 ms,
seen by strace in this source's workers and reproduced in
``tests/spark/test_worker_socket.py``:

- the JVM sends a task's command and then its input in two small writes; Nagle holds
  the input until the command is acknowledged, and the worker, which has read the
  command and has nothing to send, acknowledges it only when its timer fires: every
  task of a Python source waited ~44 ms for its one-row input;
- the worker's last small write of a task (the end of its Arrow stream) waits the same
  way for the JVM's delayed ACK, so the JVM learns late that the task ended.

Spark fixed the same pair on another of its Python connections (SPARK-51667, the state
server: TCP_NODELAY). ``avoid_ack_stalls`` does it from the worker's side, for the
connection a task of this source runs on:

- ``TCP_NODELAY``: the worker's writes leave at once (Spark already buffers them in
  64 KiB, so this adds no small packets);
- ``TCP_QUICKACK``: Linux sends the ACK it is delaying now (and stops delaying until
  the connection looks interactive again). Called when a task unpickles its reader,
  after the command arrived and before the input is read, it lets the JVM send the
  input at once.

Measured (groupBy of 10^6 records in 4 partitions, ``local[*]`` on 2 cores, medians of
7 runs alternated in one session): 341 -> 261 ms, 0.52 -> 0.68 of ``spark.read.text``.

Scope: only inside a Spark Python worker (Spark sets ``PYTHON_WORKER_FACTORY_SECRET``
for every worker it starts; a driver or another program is left alone), only on Linux
(``/proc/self/fd``, ``TCP_QUICKACK``), and only on loopback TCP connections: in a
worker that is the one to its JVM (a connection a user's code opened to a local
service would get the same two options, which change no data, only when packets
leave). ``SEGLOG_SPARK_QUICKACK=0`` turns it off.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import stat
from typing import Any

_FD_DIR = "/proc/self/fd"


def avoid_ack_stalls() -> int:
    """Set ``TCP_NODELAY`` and ``TCP_QUICKACK`` on this Spark worker's loopback TCP
    connections (see the module docstring). Cost: a listing of the process's
    descriptors and two ``setsockopt`` per connection, some tens of microseconds.

    Returns:
        How many connections were set (0 outside a Spark worker, when turned off, or
        where the platform lacks the options).
    """
    if not os.environ.get("PYTHON_WORKER_FACTORY_SECRET"):
        return 0
    if os.environ.get("SEGLOG_SPARK_QUICKACK", "1") == "0":
        return 0
    quickack = getattr(socket, "TCP_QUICKACK", None)
    if quickack is None or not os.path.isdir(_FD_DIR):
        return 0
    done = 0
    for fd in _loopback_tcp_fds():
        sock = socket.socket(fileno=fd)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.IPPROTO_TCP, quickack, 1)
            done += 1
        except OSError:
            pass  # closed or shut down under us: nothing to speed up
        finally:
            sock.detach()  # the descriptor stays Spark's
    return done


def _loopback_tcp_fds() -> list[int]:
    """One descriptor per connected loopback TCP socket of this process.

    Spark's worker holds its connection under three descriptors (the socket and the
    two ``dup``s its reader and writer files wrap); one is enough to set options.
    """
    fds: list[int] = []
    seen: set[int] = set()
    for name in os.listdir(_FD_DIR):
        fd = int(name)
        try:
            st = os.fstat(fd)
        except OSError:
            continue  # the listing's own descriptor, or one closed since
        if not stat.S_ISSOCK(st.st_mode) or st.st_ino in seen:
            continue
        seen.add(st.st_ino)
        if _is_loopback_tcp(fd):
            fds.append(fd)
    return fds


def _is_loopback_tcp(fd: int) -> bool:
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        return False
    try:
        if sock.type != socket.SOCK_STREAM or sock.family not in (
            socket.AF_INET,
            socket.AF_INET6,
        ):
            return False
        try:
            peer: Any = sock.getpeername()
        except OSError:
            return False  # listening or not connected
        address = ipaddress.ip_address(peer[0])
        mapped = getattr(address, "ipv4_mapped", None)
        return bool((mapped or address).is_loopback)
    finally:
        sock.detach()


class UnpickledInTasks:
    """Base of the readers Spark pickles to its tasks. A task unpickles its reader
    right after the task's command arrived and before it reads its input: the moment
    to send the ACK the JVM's input is waiting for (``avoid_ack_stalls``)."""

    def __setstate__(self, state: dict[str, Any]) -> None:
        avoid_ack_stalls()
        self.__dict__.update(state)
