"""The metrics drop-ins of the unit (``systemd/seglogfs-metrics.conf``, and
``seglogfs-metrics-root.conf`` beside the root drop-in): they verify cleanly, open the
network and nothing else of the sandbox, and a daemon started as the unit with them
serves ``/metrics`` to a scraper in the host's namespace, which the unit alone does not
let it do."""

from __future__ import annotations

import shutil
import socket
import subprocess
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from .test_unit import (
    MOUNT_NAMESPACE,
    NO_NEW_PRIVILEGES,
    ROOT,
    ROOT_DROP_IN,
    UNIT,
    _directives,
    _Instance,
    _mdwe_enforced,
    _unit_for_this_machine,
    _verify_is_silent,
)

METRICS_DROP_IN = ROOT / "systemd" / "seglogfs-metrics.conf"
METRICS_ROOT_DROP_IN = ROOT / "systemd" / "seglogfs-metrics-root.conf"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _install(tmp_path: Path, *drop_ins: tuple[Path, str]) -> Path:
    unit = _unit_for_this_machine(tmp_path)
    directory = tmp_path / f"{UNIT.name}.d"
    directory.mkdir()
    for source, name in drop_ins:
        shutil.copy(source, directory / name)
    return unit


def test_the_metrics_drop_in_opens_the_loopback_and_nothing_else(tmp_path: Path) -> None:
    _verify_is_silent(_install(tmp_path, (METRICS_DROP_IN, "metrics.conf")))
    added = _directives(METRICS_DROP_IN.read_text())
    assert added == {"PrivateNetwork": ["no"], "IPAddressAllow": ["localhost"]}
    # Still no mount namespace and nothing that implies NoNewPrivileges=: the
    # unprivileged unit's fusermount3 keeps working.
    assert not set(added) & {*MOUNT_NAMESPACE, *NO_NEW_PRIVILEGES}
    merged = _directives(UNIT.read_text(), METRICS_DROP_IN.read_text())
    assert merged["PrivateNetwork"][-1] == "no"  # the last assignment wins
    assert merged["IPAddressDeny"] == ["any"]  # everything else stays denied
    assert merged["PrivateMounts"] == ["no"]


def test_with_the_root_drop_in_tcp_is_added_to_the_address_families(tmp_path: Path) -> None:
    unit = _install(
        tmp_path,
        (ROOT_DROP_IN, "root.conf"),
        (METRICS_DROP_IN, "metrics.conf"),
        (METRICS_ROOT_DROP_IN, "metrics-root.conf"),
    )
    _verify_is_silent(unit)
    added = _directives(METRICS_ROOT_DROP_IN.read_text())
    assert added == {"RestrictAddressFamilies": ["AF_INET AF_INET6"]}
    merged = _directives(
        UNIT.read_text(),
        ROOT_DROP_IN.read_text(),
        METRICS_DROP_IN.read_text(),
        METRICS_ROOT_DROP_IN.read_text(),
    )
    # systemd merges the lists of RestrictAddressFamilies= given more than once.
    families = {f for value in merged["RestrictAddressFamilies"] for f in value.split()}
    assert families == {"AF_UNIX", "AF_INET", "AF_INET6"}
    assert merged["NoNewPrivileges"] == ["yes"]


def _scrape(port: int) -> set[str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {family.name for family in text_string_to_metric_families(text)}


@pytest.mark.skipif(not Path("/dev/fuse").exists(), reason="no /dev/fuse")
@pytest.mark.parametrize("root", [False, True], ids=["unit", "root drop-in"])
def test_the_unit_with_the_drop_in_is_scraped_from_the_host(tmp_path: Path, root: bool) -> None:
    """As ``test_the_sandbox_keeps_the_mount_working`` runs the unit (PrivateNetwork=
    as ``unshare --net``, NoNewPrivileges= and MemoryDenyWriteExecute= with the root
    drop-in): with the metrics drop-in the scraper on the host reaches ``/metrics``."""
    if root and not _mdwe_enforced():
        pytest.skip("this kernel has no PR_SET_MDWE (Linux 6.3+)")
    drop_ins = [ROOT_DROP_IN, METRICS_DROP_IN, METRICS_ROOT_DROP_IN] if root else [METRICS_DROP_IN]
    instance = _Instance(tmp_path, *drop_ins)
    port = _free_port()
    instance.environment["SEGLOG_OPTIONS"] = f"--metrics 127.0.0.1:{port}"
    process = instance.start(sandboxed=True)
    try:
        (instance.mountpoint / "t").mkdir()
        with open(instance.mountpoint / "t" / "0", "a") as partition:
            partition.write("scraped\n")
        names = _scrape(port)
        assert {"kafka_log_log_logendoffset", "seglogfs_fuse_request_duration_seconds"} <= names
        stop, _ = instance.command("ExecStop")
        subprocess.run(stop, check=True, timeout=30)
        _out, err = process.communicate(timeout=60)
        assert process.returncode == 0, err.decode()
    finally:
        instance.close(process)


@pytest.mark.skipif(not Path("/dev/fuse").exists(), reason="no /dev/fuse")
def test_without_the_drop_in_the_unit_listens_where_no_scraper_reaches(tmp_path: Path) -> None:
    """What the drop-in is for: under the unit's PrivateNetwork=yes the daemon starts
    and binds 127.0.0.1 of its own namespace; the host's 127.0.0.1 has no listener."""
    instance = _Instance(tmp_path)
    port = _free_port()
    instance.environment["SEGLOG_OPTIONS"] = f"--metrics 127.0.0.1:{port}"
    process = instance.start(sandboxed=True)
    try:
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
        stop, _ = instance.command("ExecStop")
        subprocess.run(stop, check=True, timeout=30)
        _out, err = process.communicate(timeout=60)
        assert process.returncode == 0, err.decode()
        assert "metrics at http://127.0.0.1" in err.decode()
    finally:
        instance.close(process)
