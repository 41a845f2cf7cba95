"""The control suites use the daemon suites' real mounts (``test_daemon_limits``)."""

from tests.daemon.conftest import mount_dir, mounts

__all__ = ["mount_dir", "mounts"]
