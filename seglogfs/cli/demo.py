"""The quick-start demo: mount a log directory, produce with ``echo``, consume with ``cat``,
``tail`` and ``seglogfs consume``, unmount, then ``seglogfs dump`` a segment.

Run ``python -m seglogfs.cli.demo [LOGDIR]`` (``bash .ci/demo`` does it after installing).
Without LOGDIR a temporary log directory is used and removed afterwards. Every step is a
real shell command on the mounted file system, printed before it runs, so the output
reads as a terminal session.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import storage

MOUNT_TIMEOUT_S = 30.0


def _mounted(path: Path) -> bool:
    target = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == target for line in f)


def _shell(command: str) -> None:
    print(f"$ {command}", flush=True)
    subprocess.run(["bash", "-c", command], check=True)


def _cli(*args: str) -> None:
    """Run a ``seglogfs`` command of this installation, shown as a shell line."""
    print(f"$ {shlex.join(['seglogfs', *args])}", flush=True)
    script = Path(sys.executable).parent / "seglogfs"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "seglogfs.cli"]
    subprocess.run([*command, *args], check=True)


def _mount_command(log_dir: Path, mountpoint: Path) -> list[str]:
    script = Path(sys.executable).parent / "seglogfs"
    if script.exists():
        return [str(script), "mount", str(log_dir), str(mountpoint)]
    return [sys.executable, "-m", "seglogfs.daemon", str(log_dir), str(mountpoint)]


def run(log_dir: Path, workdir: Path) -> None:
    print(f"# storage engine: {storage.build_info}", flush=True)
    mnt = workdir / "mnt"
    mnt.mkdir()
    command = _mount_command(log_dir, mnt)
    print(f"$ {shlex.join(['seglogfs', *command[-3:]])} &", flush=True)
    daemon = subprocess.Popen(command)
    try:
        deadline = time.monotonic() + MOUNT_TIMEOUT_S
        while not _mounted(mnt):
            if daemon.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the mount did not come up (exit code {daemon.poll()})")
            time.sleep(0.05)
        m = shlex.quote(str(mnt))
        if (log_dir / "orders-0").is_dir():
            # A kept DIR run again: the topic and its records are still there.
            print("# orders exists from an earlier run: this run appends to it", flush=True)
        _shell(f"mkdir -p {m}/orders")
        _shell(f"echo 'order 1: 2 coffees' >> {m}/orders/0")
        _shell(f"printf 'order 2: 1 tea\\norder 3: 3 croissants\\n' >> {m}/orders/0")
        _shell(f"cat {m}/orders/0")
        _shell(f"tail -n 1 {m}/orders/0")
        print(f"$ tail -f -s 0.2 {m}/orders/0 &   # follows new lines", flush=True)
        tail = subprocess.Popen(["tail", "-f", "-s", "0.2", "-n", "0", str(mnt / "orders" / "0")])
        try:
            for i in range(4, 7):
                time.sleep(0.4)
                _shell(f"echo 'order {i}: {i} muffins' >> {m}/orders/0")
            time.sleep(0.6)
        finally:
            tail.terminate()
            tail.wait()
        _shell(f"cat {m}/orders/0@-2   # a view: the last two records")
        _shell(f"ls -l {m}/orders && getfattr -d --absolute-names {m}/orders/0")
        # The command line reads the same files while the daemon writes them.
        _cli("consume", "-d", str(log_dir), "orders", "-o", "-2", "--format", "json")
        print("$ kill -TERM %1   # unmount: flush, checkpoint, clean shutdown", flush=True)
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(30)
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
        if _mounted(mnt):
            subprocess.run(["fusermount3", "-uz", str(mnt)], check=False)
    print(f"\nthe log directory, Kafka's on-disk layout ({log_dir}):", flush=True)
    for path in sorted(log_dir.rglob("*")):
        if path.is_file():
            print(f"  {path.relative_to(log_dir)}  {path.stat().st_size} bytes")
    print(flush=True)
    # What Kafka's kafka-dump-log.sh prints for the segment.
    _cli("dump", "--print-data-log", str(log_dir / "orders-0" / "00000000000000000000.log"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log_dir", nargs="?", type=Path, help="log directory to keep")
    args = parser.parse_args(argv)
    try:
        with tempfile.TemporaryDirectory(prefix="seglog-demo-") as tmp:
            log_dir = args.log_dir if args.log_dir is not None else Path(tmp) / "logs"
            run(log_dir.resolve(), Path(tmp))
    except subprocess.CalledProcessError as exc:
        # The step printed its own error above; name it in one line, no traceback.
        step = exc.cmd if isinstance(exc.cmd, str) else shlex.join(map(str, exc.cmd))
        print(f"demo: error: exit code {exc.returncode} from: {step}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
