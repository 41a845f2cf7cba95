"""Power loss: the crash states of recorded workloads, opened and checked.

Each workload of ``power_loss.workloads`` runs in-process under the recorder; the
crash states a power cut may leave at sampled cut points are materialised, opened
read-only and writable (recovery), and checked against what the engine promised
(``power_loss.checker``). Two persistence models (``power_loss.crash_states``):

- ``ext4-ordered`` (ext4's default mode): no violation may be found;
- ``posix`` (a name is durable only after an fsync of its directory): none either. It
  found three defects, now fixed and kept as regressions in
  ``test_power_loss_regressions.py``: a new segment's name never made durable (D1),
  retention's renames reaching the disk out of order (D2), a roll creating the new
  segment before the sealed one was durable (D3).

The ``compaction`` workload (keyed records, tombstones, forced cleaning passes with and
without the position index) found three more under both models, also fixed and kept
there: a positioned pass's commit point with no durable anchor for the units (D4), a
reader ignoring a committed but unfinished swap (D5), and, through the position check
it added, a reader taking positions from unsynced index entries (D6). D7 (completing an
interrupted swap after a power cut: its unlinks not durable before its rename) was found
reading the loader; its regression builds the state the random runs rarely reach.

Runs from a crash state (recovery, then more appends, a power cut during either)
are explored too. The CI budget is ``explore.CI``; ``pytest -m long`` runs ``LONG``
on workloads twice the size. ``pytest -s`` prints the figures;
``SEGLOG_POWER_LOSS_SEED=N`` draws other workloads, cuts and states;
``SEGLOG_POWER_LOSS_KEEP=DIR`` copies each violating state (before recovery) there.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from .power_loss.crash_states import Analysis, Model, recovery_cuts, swap_commit_cuts
from .power_loss.explore import CI, LONG, SEED, Budget, Exploration, explore, scratch
from .power_loss.workloads import WORKLOADS, Recording, record_recovery, record_workload

NAMES = sorted(WORKLOADS)


@pytest.fixture
def scratch_path() -> Iterator[Path]:
    """On tmpfs where there is one: recordings fsync a lot, and their fsyncs prove
    nothing (the recorder says what is durable), so they need not reach a disk."""
    with scratch() as path:
        yield path


def _record(scratch_path: Path, name: str, *, scale: int) -> Recording:
    return record_workload(name, scratch_path / "logs", scale=scale, seed=SEED)


def _report(result: Exploration) -> None:
    print(result.summary())
    for violation in result.violations[:5]:
        print("   ", violation)


def _assert_clean(result: Exploration) -> None:
    _report(result)
    assert result.checked > 0
    assert not result.violations, "\n".join(str(v) for v in result.violations[:10])


def _after_recovery(
    scratch_path: Path,
    model: Model,
    *,
    budget: Budget,
    runs: int,
    scale: int,
    every_recovery_step: bool,
) -> list[Exploration]:
    """Explore runs that start from crash states of the workloads (drawn, seeded);
    compaction's also from a cleaning pass interrupted after its commit point (a
    random cut rarely lands there with several replaced segments left to remove).
    Those runs, and every run when ``every_recovery_step``, are cut after each step
    of their recovery too (``recovery_cuts``): a second power cut during recovery."""
    rng = random.Random(f"after-recovery/{model.value}/{SEED}")
    results = []
    for name in ("appends_and_flushes", "retention", "reopen", "topics", "compaction"):
        first = _record(scratch_path / name, name, scale=scale)
        analysis = Analysis(first.recorder.initial, first.ops)
        starts = [
            (rng.randrange(len(first.ops) // 3, len(first.ops) + 1), every_recovery_step)
            for _ in range(runs)
        ]
        if name == "compaction":
            swaps = swap_commit_cuts(first.ops)
            starts += [(cut, True) for cut in rng.sample(swaps, min(runs, len(swaps)))]
        for run, (cut, step_by_step) in enumerate(starts):
            state = rng.choice(analysis.states(cut, model, 3, rng))
            label = f"{name} cut {cut} ({state.how}), then recovery"
            second = record_recovery(
                state,
                first.oracle.at(cut),
                scratch_path / name / f"run{run}",
                now_ms=first.now_ms,
                name=label,
                seed=run,
            )
            extra = recovery_cuts(second.ops) if step_by_step else ()
            results.append(explore(second, model, budget, extra_cuts=extra))
    return results


# -- the CI run ----------------------------------------------------------------------------


@pytest.mark.parametrize("model", list(Model))
@pytest.mark.parametrize("name", NAMES)
def test_power_loss(scratch_path: Path, name: str, model: Model) -> None:
    _assert_clean(explore(_record(scratch_path, name, scale=1), model, CI))


@pytest.mark.parametrize("model", list(Model))
def test_power_loss_after_recovery(scratch_path: Path, model: Model) -> None:
    budget = Budget(cuts=12, states_per_cut=2)
    for result in _after_recovery(
        scratch_path, model, budget=budget, runs=1, scale=1, every_recovery_step=False
    ):
        _assert_clean(result)


# -- the long run ---------------------------------------------------------------------------


@pytest.mark.long
@pytest.mark.parametrize("model", list(Model))
@pytest.mark.parametrize("name", NAMES)
def test_power_loss_long(scratch_path: Path, name: str, model: Model) -> None:
    _assert_clean(explore(_record(scratch_path, name, scale=2), model, LONG))


@pytest.mark.long
@pytest.mark.timeout(3600)  # every recovery step cut: about 10 minutes a model
@pytest.mark.parametrize("model", list(Model))
def test_power_loss_after_recovery_long(scratch_path: Path, model: Model) -> None:
    budget = Budget(cuts=100, states_per_cut=5)
    for result in _after_recovery(
        scratch_path, model, budget=budget, runs=3, scale=2, every_recovery_step=True
    ):
        _assert_clean(result)
