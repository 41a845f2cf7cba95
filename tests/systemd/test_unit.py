"""The systemd template unit: it verifies cleanly, and its ExecStart/ExecStop/
ExecStopPost commands, run as systemd would run them, give READY=1 only once the mount
answers, keep WATCHDOG=1 coming, and unmount with exit code 0."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "systemd" / "seglogfs@.service"
EXAMPLE = ROOT / "systemd" / "seglogfs-example.conf"
INSTALLED = "/usr/local/bin/seglogfs"
SCRIPT = Path(sys.executable).with_name("seglogfs")


def _unit_for_this_machine(directory: Path) -> Path:
    """The unit as installed here: the README links the console script to
    /usr/local/bin; here it is the venv's script."""
    unit = directory / UNIT.name
    unit.write_text(UNIT.read_text().replace(INSTALLED, str(SCRIPT)))
    return unit


def _directives(text: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line and not line.startswith(("#", "[")) and "=" in line:
            key, _, value = line.partition("=")
            found.setdefault(key.strip(), []).append(value.strip())
    return found


def test_unit_has_what_the_service_needs() -> None:
    directives = _directives(UNIT.read_text())
    assert directives["Type"] == ["notify"]
    assert directives["EnvironmentFile"] == ["/etc/seglogfs/%i.conf"]
    assert directives["ExecStart"][0].startswith(f"{INSTALLED} mount ")
    assert directives["ExecStop"] == ["/usr/bin/fusermount3 -u ${SEGLOG_MOUNTPOINT}"]
    assert directives["ExecStopPost"] == ["-/usr/bin/fusermount3 -u -z ${SEGLOG_MOUNTPOINT}"]
    assert directives["KillMode"] == ["mixed"]
    assert directives["Restart"] == ["on-failure"]
    assert int(directives["WatchdogSec"][0]) > 0
    assert directives["User"] == ["seglog"]
    # Nothing that gives the service its own mount namespace (the mount would be
    # invisible outside) or forbids the setuid fusermount3.
    for hiding in (
        "PrivateTmp",
        "ProtectSystem",
        "ProtectHome",
        "PrivateDevices",
        "PrivateMounts",
        "ReadWritePaths",
        "ReadOnlyPaths",
        "NoNewPrivileges",
        "SystemCallFilter",
        "DynamicUser",
        "MountFlags",
    ):
        assert hiding not in directives, hiding
    example = _directives(EXAMPLE.read_text())
    assert set(example) == {"SEGLOG_LOG_DIR", "SEGLOG_MOUNTPOINT", "SEGLOG_OPTIONS"}


def test_systemd_analyze_verify_is_silent(tmp_path: Path) -> None:
    unit = _unit_for_this_machine(tmp_path)
    result = subprocess.run(
        ["systemd-analyze", "verify", str(unit.with_name("seglogfs@main.service"))],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (result.returncode, result.stderr, result.stdout) == (0, "", "")


def test_unmodified_unit_only_misses_the_linked_script(tmp_path: Path) -> None:
    if Path(INSTALLED).exists():
        pytest.skip(f"{INSTALLED} is installed: the verify test covers the unit as it is")
    shutil.copy(UNIT, tmp_path / UNIT.name)
    result = subprocess.run(
        ["systemd-analyze", "verify", str(tmp_path / "seglogfs@main.service")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    lines = {line for line in result.stderr.splitlines() if line}
    assert lines == {
        f"seglogfs@main.service: Command {INSTALLED} is not executable: No such file or directory"
    }


def _expand(command: str, environment: dict[str, str]) -> tuple[list[str], bool]:
    """An Exec*= line as systemd runs it: a leading '-' (failure ignored) or '+'
    (full privileges) dropped, ${VAR} replaced as one word, $VAR split at spaces."""
    ignore_failure = False
    while command[0] in "-+":
        ignore_failure |= command[0] == "-"
        command = command[1:]
    argv: list[str] = []
    for word in shlex.split(command):
        if word.startswith("${") and word.endswith("}"):
            argv.append(environment[word[2:-1]])
        elif word.startswith("$"):
            argv.extend(environment[word[1:]].split())
        else:
            argv.append(word)
    return argv, ignore_failure


def _receive(sock: socket.socket, timeout: float) -> list[str]:
    sock.settimeout(timeout)
    try:
        data = sock.recv(4096)
    except TimeoutError:
        return []
    return data.decode().split("\n")


@pytest.mark.skipif(not Path("/dev/fuse").exists(), reason="no /dev/fuse")
def test_exec_start_notifies_and_exec_stop_unmounts(tmp_path: Path) -> None:
    directives = _directives(UNIT.read_text().replace(INSTALLED, str(SCRIPT)))
    environment = {
        "SEGLOG_LOG_DIR": str(tmp_path / "logs"),
        "SEGLOG_MOUNTPOINT": str(tmp_path / "mnt"),
        "SEGLOG_OPTIONS": "",
    }
    for command in directives["ExecStartPre"]:
        argv, _ = _expand(command, environment)
        if argv[0] == "/usr/bin/install":  # as root here: no "seglog" user to own them
            argv = ["/usr/bin/install", "-d", *argv[-2:]]
        subprocess.run(argv, check=True, timeout=30)
    mountpoint = Path(environment["SEGLOG_MOUNTPOINT"])
    assert mountpoint.is_dir()

    notify_path = tmp_path / "notify.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(str(notify_path))
    start, _ = _expand(directives["ExecStart"][0], environment)
    env = {
        **os.environ,
        **environment,
        "NOTIFY_SOCKET": str(notify_path),
        "WATCHDOG_USEC": "1000000",  # WatchdogSec=1: a ping at least every 0.5 s
    }
    process = subprocess.Popen(start, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        messages: list[tuple[float, str]] = []
        deadline = time.monotonic() + 60
        while not any(m == "READY=1" for _t, m in messages):
            assert time.monotonic() < deadline, "no READY=1 within 60 s"
            assert process.poll() is None, process.communicate()
            got = _receive(listener, 0.05)
            if any(m == "READY=1" for m in got):
                # Right when READY=1 arrives, the mount must already answer.
                assert os.path.ismount(mountpoint)
                assert os.listdir(mountpoint) == []
                (mountpoint / "events").mkdir()
            messages.extend((time.monotonic(), m) for m in got if m)
        ready_at = next(t for t, m in messages if m == "READY=1")
        while time.monotonic() < ready_at + 2.5:
            messages.extend((time.monotonic(), m) for m in _receive(listener, 0.5) if m)
        pings = [t for t, m in messages if m == "WATCHDOG=1" and t > ready_at]
        assert len(pings) >= 4, messages
        assert max(b - a for a, b in zip([ready_at, *pings], pings, strict=False)) < 1.0
        # The mount works: a topic made through it holds what is written.
        with open(mountpoint / "events" / "0", "a") as partition:
            partition.write("hello\n")
        assert (mountpoint / "events" / "0").read_text() == "hello\n"

        stop, _ = _expand(directives["ExecStop"][0], environment)
        subprocess.run(stop, check=True, timeout=30)
        _out, err = process.communicate(timeout=60)
        assert process.returncode == 0, err.decode()
        stop_post, ignore_failure = _expand(directives["ExecStopPost"][0], environment)
        assert ignore_failure  # nothing left to unmount after a clean stop: may fail
        subprocess.run(stop_post, check=False, timeout=30, capture_output=True)
        assert not os.path.ismount(mountpoint)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
            subprocess.run(["fusermount3", "-u", "-z", str(mountpoint)], check=False)
        listener.close()
    # The files survive the mount: the log directory holds the record.
    result = subprocess.run(
        [str(SCRIPT), "consume", "events", "-d", environment["SEGLOG_LOG_DIR"]],
        capture_output=True,
        timeout=60,
        check=True,
    )
    assert result.stdout == b"hello\n"


class _Instance:
    """One instance of the unit run as systemd would: ExecStartPre, then ExecStart with
    a NOTIFY_SOCKET this object listens on."""

    def __init__(self, tmp_path: Path) -> None:
        self.directives = _directives(UNIT.read_text().replace(INSTALLED, str(SCRIPT)))
        self.environment = {
            "SEGLOG_LOG_DIR": str(tmp_path / "logs"),
            "SEGLOG_MOUNTPOINT": str(tmp_path / "mnt"),
            "SEGLOG_OPTIONS": "",
        }
        self.mountpoint = Path(self.environment["SEGLOG_MOUNTPOINT"])
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.listener.bind(str(tmp_path / "notify.sock"))
        self.messages: list[str] = []

    def command(self, directive: str) -> tuple[list[str], bool]:
        return _expand(self.directives[directive][0], self.environment)

    def start(self, *, bounded: bool = False) -> subprocess.Popen[bytes]:
        """Run ExecStartPre and ExecStart; ``bounded`` applies the unit's
        ``CapabilityBoundingSet=`` (with setpriv) as systemd would."""
        for command in self.directives["ExecStartPre"]:
            argv, _ = _expand(command, self.environment)
            subprocess.run(["/usr/bin/install", "-d", *argv[-2:]], check=True, timeout=30)
        env = {
            **os.environ,
            **self.environment,
            "NOTIFY_SOCKET": self.listener.getsockname(),
            "WATCHDOG_USEC": "1000000",
        }
        argv, _ = self.command("ExecStart")
        if bounded:
            (capabilities,) = self.directives["CapabilityBoundingSet"]
            keep = ",".join("+" + c.lower().removeprefix("cap_") for c in capabilities.split())
            argv = ["setpriv", f"--bounding-set=-all,{keep}", "--inh-caps=-all", *argv]
        process = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        while "READY=1" not in self.messages:
            assert time.monotonic() < deadline, "no READY=1 within 60 s"
            assert process.poll() is None, process.communicate()
            self.messages.extend(m for m in _receive(self.listener, 0.05) if m)
        assert os.path.ismount(self.mountpoint)
        return process

    def close(self, process: subprocess.Popen[bytes]) -> None:
        if process.poll() is None:
            process.kill()
            process.wait()
        subprocess.run(
            ["fusermount3", "-u", "-z", str(self.mountpoint)], check=False, capture_output=True
        )
        if process.stderr is not None:
            process.stderr.close()
        self.listener.close()


@pytest.mark.skipif(not Path("/dev/fuse").exists(), reason="no /dev/fuse")
def test_sigterm_from_kill_mode_mixed_stops_cleanly(tmp_path: Path) -> None:
    instance = _Instance(tmp_path)
    process = instance.start()
    try:
        (instance.mountpoint / "t").mkdir()
        with open(instance.mountpoint / "t" / "0", "a") as partition:
            partition.write("before the stop\n")
        process.send_signal(signal.SIGTERM)  # what KillMode=mixed sends the main process
        _out, err = process.communicate(timeout=60)
        assert process.returncode == 0, err.decode()
        assert not os.path.ismount(instance.mountpoint)
        while got := _receive(instance.listener, 0.5):  # every datagram still queued
            instance.messages.extend(m for m in got if m)
        assert "STOPPING=1" in instance.messages
    finally:
        instance.close(process)
    # A clean stop leaves Kafka's clean-shutdown marker: the next open recovers nothing.
    assert (Path(instance.environment["SEGLOG_LOG_DIR"]) / ".kafka_cleanshutdown").exists()


@pytest.mark.skipif(not Path("/dev/fuse").exists(), reason="no /dev/fuse")
def test_after_a_crash_exec_stop_post_lets_the_restart_mount_again(tmp_path: Path) -> None:
    instance = _Instance(tmp_path)
    process = instance.start()
    try:
        (instance.mountpoint / "t").mkdir()
        with open(instance.mountpoint / "t" / "0", "a") as partition:
            partition.write("survives the crash\n")
        process.kill()  # SIGKILL: no unmount, no checkpoint, no clean-shutdown marker
        process.communicate(timeout=30)
        with pytest.raises(OSError, match="not connected"):
            os.listdir(instance.mountpoint)  # the dead mount a restart would trip over
        stop_post, ignore_failure = instance.command("ExecStopPost")
        assert ignore_failure
        subprocess.run(stop_post, check=True, timeout=30)
        assert not os.path.ismount(instance.mountpoint)
        instance.messages.clear()
        process = instance.start()  # Restart=on-failure runs ExecStartPre + ExecStart
        assert (instance.mountpoint / "t" / "0").read_text() == "survives the crash\n"
        stop, _ = instance.command("ExecStop")
        subprocess.run(stop, check=True, timeout=30)
        _out, err = process.communicate(timeout=60)
        assert process.returncode == 0, err.decode()
    finally:
        instance.close(process)


@pytest.mark.skipif(not Path("/dev/fuse").exists(), reason="no /dev/fuse")
def test_the_capability_bounding_set_is_enough_to_mount(tmp_path: Path) -> None:
    instance = _Instance(tmp_path)
    process = instance.start(bounded=True)
    try:
        status = Path(f"/proc/{process.pid}/status").read_text()
        line = next(line for line in status.splitlines() if line.startswith("CapBnd:"))
        bounding = int(line.split()[1], 16)
        assert bounding == 1 << 21  # CAP_SYS_ADMIN alone
        (instance.mountpoint / "t").mkdir()
        with open(instance.mountpoint / "t" / "0", "a") as partition:
            partition.write("bounded\n")
        assert (instance.mountpoint / "t" / "0").read_text() == "bounded\n"
        stop, _ = instance.command("ExecStop")
        subprocess.run(stop, check=True, timeout=30)
        _out, err = process.communicate(timeout=60)
        assert process.returncode == 0, err.decode()
    finally:
        instance.close(process)
