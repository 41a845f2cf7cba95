"""Explore the crash states of a recording: choose cuts, draw states, check each one."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import tempfile
import time
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .checker import Violation, check_state
from .crash_states import Analysis, Model, choose_cuts
from .workloads import Recording

__all__ = ["CI", "LONG", "SEED", "Budget", "Exploration", "explore", "scratch", "scratch_dir"]


@dataclass(frozen=True)
class Budget:
    """How much to explore: cut points per recording, states per cut."""

    cuts: int
    states_per_cut: int


CI = Budget(cuts=40, states_per_cut=3)
LONG = Budget(cuts=300, states_per_cut=8)
SEED = int(os.environ.get("SEGLOG_POWER_LOSS_SEED", "17"))
"""The sampler's seed (cut points and states); set the variable to explore others."""
EXTRA_STATES = 6
"""States drawn at each cut asked for by name (``explore``'s ``extra_cuts``): beyond
"durable only" and "all issued", random ones, where several steps not yet durable
reach the disk in some mix (two states per cut draw none)."""
KEEP = os.environ.get("SEGLOG_POWER_LOSS_KEEP")
"""A directory to copy each violating crash state to, as it was before recovery."""


@dataclass
class Exploration:
    workload: str
    model: Model
    ops: int
    cuts: int = 0
    states: int = 0  # distinct states drawn (per cut)
    checked: int = 0  # states opened and checked (the rest were checked already)
    seconds: float = 0.0
    seed: int = SEED
    violations: list[Violation] = field(default_factory=list)

    def summary(self) -> str:
        return (
            f"{self.workload} [{self.model.value}, seed {self.seed}]: {self.ops} ops, "
            f"{self.cuts} cuts, "
            f"{self.states} crash states ({self.checked} opened), "
            f"{len(self.violations)} violations, {self.seconds:.1f} s"
        )


def scratch_dir() -> Path:
    """A new directory for recordings and materialised states: on tmpfs when there is
    one, where fsyncs cost nothing (they prove nothing here: the recorder, not the
    disk, says what is durable)."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        return Path(tempfile.mkdtemp(prefix="seglog-power-", dir=shm))
    return Path(tempfile.mkdtemp(prefix="seglog-power-"))


@contextlib.contextmanager
def scratch() -> Iterator[Path]:
    """``scratch_dir()``, removed afterwards."""
    path = scratch_dir()
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def explore(
    recording: Recording,
    model: Model,
    budget: Budget,
    *,
    seed: int = SEED,
    stop_after: int | None = None,
    workspace: Path | None = None,
    extra_cuts: Collection[int] = (),
) -> Exploration:
    """Check up to ``budget`` crash states of ``recording`` under ``model``, and
    ``EXTRA_STATES`` states at each of ``extra_cuts`` besides.

    A state already checked against the same expectation (the same bytes at another
    cut, with the same promises in force) is counted but not opened again.
    ``stop_after`` ends the run once that many violations were found.
    """
    started = time.monotonic()
    rng = random.Random(f"{seed}/{recording.name}/{model.value}")
    analysis = Analysis(recording.recorder.initial, recording.ops)
    result = Exploration(recording.name, model, len(recording.ops), seed=seed)
    checked: set[tuple[str, tuple[object, ...]]] = set()
    own = workspace is None
    base = scratch_dir() if workspace is None else workspace
    try:
        cuts = sorted(set(choose_cuts(recording.ops, budget.cuts, rng)) | set(extra_cuts))
        for cut in cuts:
            result.cuts += 1
            expect = recording.oracle.at(cut)
            key = expect.key()
            per_cut = budget.states_per_cut
            if cut in extra_cuts:
                per_cut = max(per_cut, EXTRA_STATES)
            for state in analysis.states(cut, model, per_cut, rng):
                result.states += 1
                signature = (state.digest(), key)
                if signature in checked:
                    continue
                checked.add(signature)
                result.checked += 1
                place = base / f"s{result.checked}"
                found = check_state(
                    state, expect, place, now_ms=recording.now_ms, workload=recording.name
                )
                if found and KEEP:
                    label = f"{recording.name}-{model.value}-cut{cut}-{state.how}"
                    state.materialize(Path(KEEP) / label.replace(" ", "_").replace("#", ""))
                result.violations += found
                shutil.rmtree(place, ignore_errors=True)
                if stop_after is not None and len(result.violations) >= stop_after:
                    return result
    finally:
        result.seconds = time.monotonic() - started
        if own:
            shutil.rmtree(base, ignore_errors=True)
    return result
