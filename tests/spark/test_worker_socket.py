"""The Nagle / delayed-ACK stalls of a Spark worker's connection, and that unpickling a
reader in a task removes them (``seglogfs.spark.worker_socket``).

The JVM's side is a stand-in in a child process, with Spark's socket settings (Nagle
on); this test process plays the worker. Each test first shows the stall on this
kernel with the tuning turned off (so it can fail for the reason it names), then its
absence with the tuning on. No SparkSession: what is measured is the socket.
"""

from __future__ import annotations

import pickle
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from seglogfs.spark.options import ReadOptions
from seglogfs.spark.reader import SeglogBatchReader
from seglogfs.spark.stream import SeglogStreamReader
from seglogfs.spark.worker_socket import avoid_ack_stalls

# What the JVM stand-in does on each one-byte order from the worker.
JVM = r"""
import socket, sys
jvm = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
while order := jvm.recv(1):
    if order == b"r":    # one request/response round, as tasks make
        jvm.sendall(b"c" * 100)
        jvm.recv(100, socket.MSG_WAITALL)
    elif order == b"t":  # a task: its command and its input in two small writes
        jvm.sendall(b"command")
        jvm.sendall(b"input")
        jvm.recv(4, socket.MSG_WAITALL)
    elif order == b"o":  # a task's output: bulk, then a small end marker
        jvm.recv(OUTPUT, socket.MSG_WAITALL)
        jvm.sendall(b"k")
""".replace("OUTPUT", "100_003")

STALL = 0.030  # Linux's delayed ACK is 40 ms at least; no stall is under 1 ms here
TASKS = 9
# A loaded machine may deschedule this process once for as long as a stall: tolerated.
HICCUPS = 1


def stalls(waits: list[float]) -> int:
    return sum(w > STALL for w in waits)


@contextmanager
def jvm_connection() -> Iterator[socket.socket]:
    """The worker's side of a connection to a JVM stand-in, already interactive (20
    request/response rounds: Linux now delays this side's ACKs)."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        jvm = subprocess.Popen([sys.executable, "-c", JVM, str(port)])
        try:
            server.settimeout(30)
            worker, _ = server.accept()
        except BaseException:
            jvm.kill()
            raise
    with worker:
        worker.settimeout(30)
        for _ in range(20):
            worker.sendall(b"r")
            worker.recv(100, socket.MSG_WAITALL)
            worker.sendall(b"x" * 100)
        try:
            yield worker
        finally:
            worker.close()
            jvm.wait(30)


def shipped_reader(kind: str) -> bytes:
    """A batch or stream reader as Spark ships it to a task."""
    options = {"path": "/x", "subscribe": "t"}
    if kind == "batch":
        return pickle.dumps(SeglogBatchReader(ReadOptions.parse(options, streaming=False)))
    return pickle.dumps(SeglogStreamReader(ReadOptions.parse(options, streaming=True)))


def input_waits(worker: socket.socket, shipped: bytes) -> list[float]:
    """Per task: from the moment its command was read (and its reader unpickled) until
    its input arrived."""
    waits = []
    for _ in range(TASKS):
        worker.sendall(b"t")
        assert worker.recv(7, socket.MSG_WAITALL) == b"command"
        pickle.loads(shipped)  # what a task does with its command
        start = time.perf_counter()
        assert worker.recv(5, socket.MSG_WAITALL) == b"input"
        waits.append(time.perf_counter() - start)
        worker.sendall(b"done")
    return waits


def output_waits(worker: socket.socket) -> list[float]:
    """Per task: from its first output write until the JVM has its end marker."""
    avoid_ack_stalls()  # as the first reader unpickled in this worker does
    waits = []
    for _ in range(TASKS):
        worker.sendall(b"o")
        start = time.perf_counter()
        worker.sendall(b"x" * 100_000)
        worker.sendall(b"end")
        assert worker.recv(1) == b"k"
        waits.append(time.perf_counter() - start)
    return waits


def in_worker(monkeypatch: pytest.MonkeyPatch, *, tuned: bool) -> None:
    monkeypatch.setenv("PYTHON_WORKER_FACTORY_SECRET", "test")  # as Spark's workers have
    monkeypatch.setenv("SEGLOG_SPARK_QUICKACK", "1" if tuned else "0")


def untuned_then_tuned(
    monkeypatch: pytest.MonkeyPatch, waits: Callable[[socket.socket], list[float]]
) -> tuple[list[float], list[float]]:
    """``waits`` on a fresh connection with the change turned off, then on one with it on."""
    runs = []
    for tuned in (False, True):
        in_worker(monkeypatch, tuned=tuned)
        with jvm_connection() as worker:
            runs.append(waits(worker))
    return runs[0], runs[1]


@pytest.mark.parametrize("kind", ["batch", "stream"])
def test_a_task_input_is_not_held_by_nagle(monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    shipped = shipped_reader(kind)
    stalled, tuned = untuned_then_tuned(monkeypatch, lambda worker: input_waits(worker, shipped))
    assert statistics.median(stalled) > STALL, stalled  # the stall exists here
    assert stalls(tuned) <= HICCUPS, tuned


def test_a_task_end_is_not_held_by_nagle(monkeypatch: pytest.MonkeyPatch) -> None:
    stalled, tuned = untuned_then_tuned(monkeypatch, output_waits)
    # Not every end stalls (only one written while data is unacknowledged).
    assert stalls(stalled) >= 2, stalled
    assert stalls(tuned) <= HICCUPS, tuned


def _nodelay(sock: socket.socket) -> int:
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)


def test_only_loopback_tcp_in_a_spark_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        accepted, _ = server.accept()
    unix_a, unix_b = socket.socketpair()
    with client, accepted, unix_a, unix_b:
        monkeypatch.delenv("PYTHON_WORKER_FACTORY_SECRET", raising=False)
        assert avoid_ack_stalls() == 0  # a driver or another program: left alone
        assert _nodelay(client) == _nodelay(accepted) == 0

        in_worker(monkeypatch, tuned=False)
        assert avoid_ack_stalls() == 0
        assert _nodelay(accepted) == 0

        in_worker(monkeypatch, tuned=True)
        assert avoid_ack_stalls() >= 2  # both ends live in this process
        assert _nodelay(client)
        assert _nodelay(accepted)
        unix_a.sendall(b"still usable")  # Unix sockets untouched, descriptors kept
        assert unix_b.recv(100) == b"still usable"
        accepted.sendall(b"ok")
        assert client.recv(2) == b"ok"
