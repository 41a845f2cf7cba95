"""Security (issue #17): topic names never leave the log directory by any path, the
control socket is never connectable by others, files get the modes a broker's would,
and ``allow_other`` is off unless asked.

Every escape is tried through each way a name reaches the engine: the mount (``mkdir``,
lookups), the control socket's ops sent raw (``create_topic``, ``produce``,
``delete_records``, ``describe_topic``, ``alter_topic``, ``delete_topic``) and the
command line; the directory that holds the log directory is listed before and after
(Spark: ``tests/spark/test_topic_names.py``)."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import subprocess
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import pytest
import trio

from seglogfs import control
from seglogfs.cli import main as cli_main
from seglogfs.control import protocol, server
from storage import LogManager
from tests.cli.conftest import SCRIPT, refused, run_script, tree
from tests.daemon.conftest import Mount, MountDir, needs_fuse


def escapes(tmp_path: Path) -> dict[str, str]:
    """Names that would leave the log directory, or pass for another topic, if they
    were joined to a path unchecked."""
    return {
        "dot-dot": "..",
        "dot": ".",
        "parent": "../escaped",
        "grandparent": "../../escaped",
        "absolute": str(tmp_path / "absolute"),  # log_dir / "/x-0" is "/x-0"
        "slash": "a/b",
        "nul": "t\x00x",
        "newline": "t\nx",
        "backslash": "..\\escaped",
        "long": "x" * 250,
        "very long": "x" * 100_000,
        "cyrillic o": "\u043erders",  # looks like "orders"
        "fullwidth o": "\uff4frders",
        "zero width": "orders\u200b",
        "empty": "",
    }


def outside(tmp_path: Path, *skip: Path) -> set[str]:
    """Everything under ``tmp_path`` but inside ``skip`` (the log directory, which the
    test lists itself, and mount points, never walked)."""
    found: set[str] = set()
    for root, dirs, files in os.walk(tmp_path):
        dirs[:] = [d for d in dirs if Path(root, d) not in skip]
        found.update(str(Path(root, name).relative_to(tmp_path)) for name in dirs + files)
    return found


def errno_of(call: Callable[[], object]) -> int:
    try:
        call()
    except OSError as exc:
        return exc.errno or 0
    raise AssertionError(f"{call} did not fail")


@pytest.fixture
def mounted(tmp_path: Path, mount_dir: MountDir) -> Mount:
    """A mount of a new log directory ``tmp_path / "logs"``."""
    return mount_dir(tmp_path / "logs")


@needs_fuse
def test_no_topic_name_escapes_through_the_mount_or_the_control_socket(
    tmp_path: Path, mounted: Mount
) -> None:
    logs, mount, mnt = mounted.log_dir, mounted, mounted.mountpoint
    (mnt / "orders").mkdir()
    around, inside = outside(tmp_path, logs, mnt), tree(logs)

    for label, name in escapes(tmp_path).items():
        # The mount: only a single path component reaches the daemon; the kernel
        # answers for '.', '..', '/', NUL and names over 255 bytes itself.
        if "/" not in name and "\x00" not in name and name:
            made = errno_of(partial(os.mkdir, mnt / name))
            assert made in (errno.EINVAL, errno.EEXIST, errno.ENAMETOOLONG), label
            if name not in (".", ".."):
                looked = errno_of(partial(os.stat, mnt / name))
                assert looked in (errno.ENOENT, errno.ENAMETOOLONG), label
        # The control socket, bypassing the command line's parsing.
        for op, args in (
            ("create_topic", {"name": name, "partitions": 1}),
            ("describe_topic", {"name": name}),
            ("alter_topic", {"name": name, "set": {"retention.ms": "1"}}),
            ("delete_topic", {"name": name}),
        ):
            with pytest.raises(control.ControlError) as info:
                control.request(logs, op, **args)
            assert info.value.kind in ("InvalidTopicError", "UnknownTopicError"), (label, op)
        answer = control.request(
            logs, "delete_records", partitions=[{"topic": name, "partition": 0, "offset": 1}]
        )
        assert isinstance(answer, list)
        assert "does not exist" in answer[0]["error"], (label, answer)
        with pytest.raises(control.ControlError) as produced:
            control.produce(logs, name, [(None, b"v", (), None)])
        assert produced.value.kind == "UnknownTopicError", label

    assert os.listdir(mnt) == ["orders"]
    assert tree(logs) == inside
    assert outside(tmp_path, logs, mnt) == around
    assert control.request(logs, "list_topics") == ["orders"]
    assert mount.stop() == 0


def test_no_topic_name_escapes_through_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    logs = tmp_path / "logs"
    assert cli_main(["topics", "create", "orders", "-d", str(logs)]) == 0
    around, inside = outside(tmp_path, logs), tree(logs)
    offsets = tmp_path / "offsets.json"
    for label, name in escapes(tmp_path).items():
        if "\x00" in name or not name:
            # An argument cannot hold NUL, and an empty one means "no topic" (describe:
            # every topic): the control socket test sends both.
            continue
        offsets.write_text(
            json.dumps({"partitions": [{"topic": name, "partition": 0, "offset": 1}]})
        )
        for command, code in (
            (["topics", "create", name], 2),
            (["topics", "describe", name], 1),
            (["topics", "alter", name, "--add-config", "retention.ms=1"], 1),
            (["topics", "delete", name], 1),
            # produce creates a missing topic (auto.create.topics.enable): a bad
            # name is then refused as topics create refuses it.
            (["produce", name], 2),
            (["consume", name], 1),
            (["delete-records", "--offset-json-file", str(offsets)], 1),
        ):
            with open(os.devnull) as nothing:
                monkeypatch.setattr("sys.stdin", nothing)
                assert cli_main([*command, "-d", str(logs)]) == code, (label, command)
            out, err = capsys.readouterr()
            said = err or out  # delete-records reports per partition, on stdout
            assert "invalid topic name" in said or "does not exist" in said, (label, said)
            assert "Traceback" not in err
    assert outside(tmp_path, logs) == around | {"offsets.json"}
    assert tree(logs) == inside
    # And through the console script itself, for the two that build paths.
    refused(
        run_script("topics", "create", "../escaped", "-d", str(logs)),
        2,
        "invalid topic name '../escaped': only ASCII letters, digits, '.', '_' and '-' are allowed",
    )
    refused(
        run_script("topics", "create", str(tmp_path / "absolute"), "-d", str(logs)),
        2,
        f"invalid topic name '{tmp_path / 'absolute'}': only ASCII letters, digits, '.', '_' "
        "and '-' are allowed",
    )
    assert outside(tmp_path, logs) == around | {"offsets.json"}


def test_a_megabyte_name_is_refused_in_one_short_line(tmp_path: Path) -> None:
    result = run_script("topics", "create", "x" * 100_000, "-d", str(tmp_path / "logs"))
    refused(
        result,
        2,
        "invalid topic name 'xxxxxxxxxxxxxxxxxxxxxxxxxxxx...xxxxxxxxxx (100000 characters)': "
        "longer than 249 characters",
    )


COLLIDING = [
    # Kafka's and seglogfs' own files: a partition directory is <name>-<N>, never one.
    "recovery-point-offset-checkpoint",
    "log-start-offset-checkpoint",
    "cleaner-offset-checkpoint",
    "meta.properties",
    ".kafka_cleanshutdown",
    ".lock",
    ".seglog.lock",
    ".seglog.sock",
    ".seglog-spark",
    "seglog-topics.json",
    # A deleted partition's directory is <topic>-<N>.<uuid>-delete: this topic's
    # directories end in -<N>, and are never taken for one (nor removed as one).
    "t-0.0123456789abcdef0123456789abcdef-delete",
    "t-0.0123456789abcdef0123456789abcdef-future",
    "t-0",
    "t",
]


@needs_fuse
def test_names_like_the_log_dirs_own_files_collide_with_nothing(mounted: Mount) -> None:
    logs, mount = mounted.log_dir, mounted
    files = {
        name: (logs / name).read_bytes()
        for name in os.listdir(logs)
        if (logs / name).is_file() and name != "seglog-topics.json"
    }
    for name in COLLIDING:
        control.request(logs, "create_topic", name=name, partitions=2)
        control.produce(logs, name, [(None, name.encode(), (), None)], partition=1)
        assert (logs / f"{name}-0").is_dir(), name
        assert (logs / f"{name}-1").is_dir(), name
    assert {name: (logs / name).read_bytes() for name in files} == files
    assert stat.S_ISSOCK(os.lstat(logs / ".seglog.sock").st_mode)
    assert sorted(os.listdir(mount.mountpoint)) == sorted(COLLIDING)
    # Kafka's KRaft metadata log is __cluster_metadata-0: Kafka refuses the name.
    with pytest.raises(control.ControlError, match="creation of internal topic"):
        control.request(logs, "create_topic", name="__cluster_metadata", partitions=1)
    assert not (logs / "__cluster_metadata-0").exists()
    assert mount.stop() == 0
    # Reopened, every one of them is still a topic holding its record.
    with LogManager.open(logs, read_only=True) as manager:
        assert manager.topics() == sorted(COLLIDING)
        for name in COLLIDING:
            assert [r.value for r in manager.log(name, 1).records(0)] == [name.encode()]
    verified = run_script("verify", str(logs))
    assert verified.code == 0, verified.out


# -- the control socket's mode ---------------------------------------------------------


async def _bridge(fn: Callable[..., object], *args: object) -> object:
    return await trio.to_thread.run_sync(fn, *args)


@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    previous = os.umask(mask)
    try:
        yield
    finally:
        os.umask(previous)


def spy_on_bind(monkeypatch: pytest.MonkeyPatch, after_bind: object) -> None:
    """Call ``after_bind(path)`` right after the server's ``bind`` returns, before it
    does anything else with the socket file (``socket_address`` wraps the bind)."""
    real = protocol.socket_address

    @contextlib.contextmanager
    def watched(log_dir: Path) -> Iterator[str]:
        with real(log_dir) as address:
            yield address
        after_bind(log_dir / control.SOCKET_NAME)  # type: ignore[operator]

    monkeypatch.setattr(server, "socket_address", watched)


async def serve_once(log_dir: Path) -> int:
    """Bind the control socket of ``log_dir`` as the daemon does, then stop; the
    socket's mode once clients may connect."""
    with LogManager.open(log_dir) as manager:
        async with trio.open_nursery() as nursery:
            path = await nursery.start(partial(server.serve, log_dir, manager, _bridge))
            mode = stat.S_IMODE(os.lstat(path).st_mode)
            nursery.cancel_scope.cancel()
    return mode


@pytest.mark.trio
@pytest.mark.parametrize("mask", [0o000, 0o002, 0o022, 0o077])
async def test_the_control_socket_is_never_connectable_by_others(
    log_dir: Path, monkeypatch: pytest.MonkeyPatch, mask: int
) -> None:
    born: list[int] = []
    spy_on_bind(monkeypatch, lambda path: born.append(stat.S_IMODE(os.lstat(path).st_mode)))
    with umask(mask):
        serving = await serve_once(log_dir)
    # Born owner-only whatever the umask (with 000 it was 0777 until the chmod: anyone
    # could connect and write through the daemon), then the documented 0660.
    assert born == [0o600 & ~mask]
    assert serving == server.SOCKET_MODE == 0o660


@pytest.mark.trio
async def test_the_socket_mode_is_never_set_through_a_symlink(
    log_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    victim = tmp_path / "victim"
    victim.write_text("secret")
    victim.chmod(0o600)

    def swap(path: Path) -> None:
        # Someone who may write the log directory replaces the socket with a symlink
        # between the bind and the chmod.
        path.rename(path.with_name("moved"))
        path.symlink_to(victim)

    spy_on_bind(monkeypatch, swap)
    with pytest.raises(ExceptionGroup) as info:
        await serve_once(log_dir)
    assert info.group_contains(OSError, match="not the socket just bound")
    assert stat.S_IMODE(victim.stat().st_mode) == 0o600  # was chmod'ed 0660


# -- modes ------------------------------------------------------------------------------


def modes(root: Path) -> dict[str, int]:
    found = {".": stat.S_IMODE(os.lstat(root).st_mode)}
    for path in root.rglob("*"):
        found[str(path.relative_to(root))] = stat.S_IMODE(os.lstat(path).st_mode)
    return found


@needs_fuse
@pytest.mark.parametrize(
    ("mask", "file_mode", "dir_mode"), [(0o022, 0o644, 0o755), (0o027, 0o640, 0o750)]
)
def test_files_get_the_modes_a_broker_gives_them(
    tmp_path: Path, mount_dir: MountDir, mask: int, file_mode: int, dir_mode: int
) -> None:
    """A Kafka broker creates its files 0666 and directories 0777, less the umask; the
    engine asks for 0644 and 0777: the same under 022 and 027, never more. The log
    directory is 0750 and the lock 0600 whatever the umask allows, the socket 0660."""
    logs = tmp_path / "logs"
    with umask(mask):
        made = subprocess.run(
            [str(SCRIPT), "topics", "create", "cli", "-d", str(logs)],
            capture_output=True,
            check=False,
        )
        assert made.returncode == 0, made.stderr
        mount = mount_dir(logs)
    (mount.mountpoint / "mounted").mkdir()
    with open(mount.mountpoint / "mounted" / "0", "a") as partition:
        partition.write("x\n")
    control.produce(logs, "cli", [(None, b"y", (), None)])
    seen = modes(logs)
    assert seen.pop(".") == 0o750
    assert seen.pop(".seglog.lock") == 0o600
    assert seen.pop(".seglog.sock") == 0o660
    for name, mode in seen.items():
        expected = dir_mode if (logs / name).is_dir() else file_mode
        assert mode == expected, (name, oct(mode))
    assert {"cli-0", "mounted-0", "seglog-topics.json"} <= set(seen)
    assert mount.stop() == 0
    assert stat.S_IMODE((logs / ".kafka_cleanshutdown").stat().st_mode) == file_mode


# -- allow_other -----------------------------------------------------------------------


def super_options(mountpoint: Path) -> list[str]:
    target = os.path.realpath(mountpoint)
    with open("/proc/self/mountinfo") as f:
        fields = next(line.split() for line in f if line.split()[4] == target)
    return fields[-1].split(",")


@needs_fuse
def test_allow_other_is_off_unless_asked(tmp_path: Path, mount_dir: MountDir) -> None:
    for name in ("plain", "ro", "internal", "config", "asked"):
        LogManager.open(tmp_path / name).close()
    for name, options in (
        ("plain", []),
        ("ro", ["-o", "ro"]),
        ("internal", ["-o", "internal"]),
        ("config", ["--config", "/dev/null"]),
    ):
        mount = mount_dir(tmp_path / name, *options)
        assert "allow_other" not in super_options(mount.mountpoint), options
        assert "default_permissions" in super_options(mount.mountpoint), options
    asked = mount_dir(tmp_path / "asked", "-o", "allow_other")
    assert "allow_other" in super_options(asked.mountpoint)
