"""``admin``'s compaction rule holds against racing requests: a policy change (control
socket, ``setfattr``) and a rendering change (``setfattr``) run in different worker
threads of the daemon, and each checks the rule against the other's result."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from seglogfs.control import admin
from storage import ConfigError, LogManager, TopicMetadata


def test_policy_change_racing_a_separator_removal_is_refused(
    log_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The rendering change has passed its check (the topic is not compacted yet) and
    # is being applied when the policy change checks: without ``TOPIC_RULES`` the
    # policy change saw the separator still there, and both went through, leaving a
    # compacted lines topic whose lines have no key.
    with LogManager.open(log_dir) as manager:
        admin.create_topic(manager, "t", 1, {}, format="lines", key_separator=":")
        applying = threading.Event()
        policy_done = threading.Event()
        engine_set_rendering = manager.set_topic_rendering

        def slow_set_rendering(name: str, fmt: str, separator: str | None) -> TopicMetadata:
            applying.set()
            # Long enough for an unlocked policy change to finish first.
            policy_done.wait(timeout=0.5)
            return engine_set_rendering(name, fmt, separator)

        monkeypatch.setattr(manager, "set_topic_rendering", slow_set_rendering)
        outcome: list[BaseException | None] = []

        def change_policy() -> None:
            applying.wait(timeout=10)
            try:
                admin.alter_topic_config(manager, "t", {"cleanup.policy": "compact"})
                outcome.append(None)
            except ConfigError as exc:
                outcome.append(exc)
            policy_done.set()

        policy = threading.Thread(target=change_policy)
        policy.start()
        admin.set_topic_rendering(manager, "t", "lines", None, key="key.separator", value="")
        policy.join(timeout=10)
        assert len(outcome) == 1
        assert isinstance(outcome[0], ConfigError), "both changes went through"
        assert "needs a key.separator" in str(outcome[0])
        assert manager.topic("t").key_separator is None
        assert not manager.topic_config("t").compact


def test_set_topic_rendering_refuses_to_drop_a_compacted_topics_separator(
    log_dir: Path,
) -> None:
    with LogManager.open(log_dir) as manager:
        admin.create_topic(
            manager, "c", 1, {"cleanup.policy": "compact"}, format="lines", key_separator=":"
        )
        with pytest.raises(ConfigError, match=r"needs a key\.separator"):
            admin.set_topic_rendering(manager, "c", "lines", None, key="key.separator", value="")
        assert manager.topic("c").key_separator == ":"
        # json lines carry their keys: allowed.
        assert (
            admin.set_topic_rendering(manager, "c", "json", None, key="format", value="json").format
            == "json"
        )
