"""The states a power cut may leave on disk, from a recording (ALICE's second half).

A *cut* ``c`` means the operations ``ops[:c]`` were issued (their calls returned) and
none after: a call in progress at the cut is modelled by the byte prefixes of writes.
What survives depends on the file system; two persistence models are built:

``POSIX`` (the stricter one, as ALICE's and CrashMonkey's weakest file systems): a
file's bytes are durable up to its last ``fsync``/``fdatasync``/``msync`` before the
cut; after that, *any prefix* of its later data operations may have reached the disk
(at operation boundaries, and at random bytes inside a write), and unsynced stores into
a mapping may survive in any subset (pages are written back independently). A name
created, renamed or removed is durable only once its directory was fsynced afterwards;
before that, the old and the new state are both possible, independently for each name
(the changes of one name survive in order: a rename of a name whose creation was lost
is lost too).

``EXT4_ORDERED`` (the realistic one: ext4 with ``data=ordered``, the default): metadata
(names, sizes, truncations, appended bytes, whose data is written before the size that
exposes them commits) reaches the disk as a prefix of the journal, in order; the prefix
holds at least everything before the last journal commit a call forced (an ``fsync``
of a directory, or of a file with uncommitted metadata of its own: the running
transaction is committed whole). The last append past the prefix may survive up to a
page boundary. Bytes overwritten in place (mapped index stores, ``pwrite`` inside the
file) are written back independently of the journal: each unsynced one may or may not
have reached the disk.

At each cut the sampler draws a bounded number of distinct states with a seeded
``random.Random``: first the least that must survive ("durable only"), then everything
issued (what a process crash leaves), then random draws.
"""

from __future__ import annotations

import hashlib
import os
import random
from bisect import bisect_left
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from .recorder import DATA_KINDS, NAMESPACE_KINDS, Kind, Op, Tree, apply_data

__all__ = ["Analysis", "CrashState", "Model", "choose_cuts"]

PAGE = 4096
_VERSION_STRIDE = 32
_INF = 1 << 62


class Model(Enum):
    EXT4_ORDERED = "ext4-ordered"
    POSIX = "posix"


@dataclass(frozen=True)
class CrashState:
    """What the disk holds after a power cut: directories and files, by path."""

    cut: int
    model: Model
    how: str  # which draw: "durable only", "all issued", "random #n", "chosen"
    dirs: tuple[str, ...]
    files: dict[str, bytes]

    def digest(self) -> str:
        h = hashlib.blake2b(digest_size=16)
        for path in self.dirs:
            h.update(b"d\0" + path.encode() + b"\0")
        for path in sorted(self.files):
            h.update(b"f\0" + path.encode() + b"\0")
            h.update(hashlib.blake2b(self.files[path], digest_size=16).digest())
        return h.hexdigest()

    def materialize(self, target: Path) -> None:
        """Write the state into the (new, empty) directory ``target``."""
        target.mkdir(parents=True)
        for path in self.dirs:
            (target / path).mkdir()
        for path, data in self.files.items():
            (target / path).write_bytes(data)


class Analysis:
    """The facts of one recording the state builder needs, computed once.

    Cost: O(ops) to build; a state costs O(namespace ops + data ops of its files).
    """

    def __init__(self, initial: Tree, ops: list[Op]) -> None:
        self.initial = initial
        self.ops = ops
        self.data_ops: dict[int, list[Op]] = {}
        self.data_seqs: dict[int, list[int]] = {}
        self.sync_seqs: dict[int, list[int]] = {}
        self.namespace_ops: list[Op] = []
        dirsyncs: dict[int, list[int]] = {}
        for op in ops:
            if op.kind in DATA_KINDS:
                self.data_ops.setdefault(op.node, []).append(op)
                self.data_seqs.setdefault(op.node, []).append(op.seq)
            elif op.kind in NAMESPACE_KINDS:
                self.namespace_ops.append(op)
            elif op.kind is Kind.FSYNC:
                self.sync_seqs.setdefault(op.node, []).append(op.seq)
            elif op.kind is Kind.DIRSYNC:
                dirsyncs.setdefault(op.node, []).append(op.seq)
        # A namespace op is durable from the first fsync of its directory (both, for a
        # rename between two) that follows it.
        self.durable_from: dict[int, int] = {}
        for op in self.namespace_ops:
            parents = {op.parent} if op.kind is not Kind.RENAME else {op.parent, op.parent2}
            when = 0
            for parent in parents:
                seqs = dirsyncs.get(parent, [])
                i = bisect_left(seqs, op.seq)
                when = max(when, seqs[i] if i < len(seqs) else _INF)
            self.durable_from[op.seq] = when
        self.forced = self._journal_forced()
        self._versions: dict[tuple[int, int], bytes] = {}

    def _journal_forced(self) -> list[int]:
        # forced[c]: ext4 must have committed every op before this seq at cut c.
        forced = [0] * (len(self.ops) + 1)
        committed = 0
        last_journaled: dict[int, int] = {}
        for op in self.ops:
            forced[op.seq] = committed
            if op.kind is Kind.DIRSYNC:
                committed = op.seq
            elif op.kind is Kind.FSYNC:
                if last_journaled.get(op.node, -1) >= committed:
                    committed = op.seq
            elif op.kind in NAMESPACE_KINDS or (op.kind in DATA_KINDS and not op.in_place):
                last_journaled[op.node] = op.seq
        forced[len(self.ops)] = committed
        return forced

    # -- per-file facts ----------------------------------------------------------

    def covered_by(self, op: Op) -> int | None:
        """The seq of the call that makes ``op`` durable: for a data op, the first
        fsync/fdatasync/msync of its file after it; for a name, the first fsync of its
        directory (both, for a rename between two); None when nothing does."""
        if op.kind in NAMESPACE_KINDS:
            when = self.durable_from[op.seq]
            return None if when >= _INF else when
        if op.kind in DATA_KINDS:
            syncs = self.sync_seqs.get(op.node, [])
            i = bisect_left(syncs, op.seq)
            return syncs[i] if i < len(syncs) else None
        return None

    def issued(self, node: int, cut: int) -> int:
        """How many of the node's data ops were issued before the cut."""
        return bisect_left(self.data_seqs.get(node, []), cut)

    def synced(self, node: int, cut: int) -> int:
        """How many of the node's data ops an fsync before the cut covers."""
        syncs = self.sync_seqs.get(node, [])
        i = bisect_left(syncs, cut)
        if i == 0:
            return 0
        return bisect_left(self.data_seqs.get(node, []), syncs[i - 1])

    def content(self, node: int, k: int) -> bytearray:
        """The node's bytes after its first ``k`` data ops (cached every few ops)."""
        base = k - k % _VERSION_STRIDE
        cached = self._versions.get((node, base))
        if cached is None:
            if base == 0:
                start = self.initial.nodes.get(node)
                cached = bytes(start.content) if start is not None else b""
            else:
                previous = self.content(node, base - _VERSION_STRIDE)
                for op in self.data_ops[node][base - _VERSION_STRIDE : base]:
                    apply_data(previous, op)
                cached = bytes(previous)
            self._versions[(node, base)] = cached
        content = bytearray(cached)
        for op in self.data_ops.get(node, [])[base:k]:
            apply_data(content, op)
        return content

    # -- states ------------------------------------------------------------------

    def states(self, cut: int, model: Model, budget: int, rng: random.Random) -> list[CrashState]:
        """Up to ``budget`` distinct states at ``cut``: durable only, all issued, random."""
        out: list[CrashState] = []
        seen: set[str] = set()
        draws = ["none", "all"] + ["random"] * (3 * budget)
        for n, draw in enumerate(draws):
            if len(out) >= budget:
                break
            how = {"none": "durable only", "all": "all issued"}.get(draw, f"random #{n - 1}")
            if model is Model.POSIX:
                state = self._posix(cut, draw, how, rng)
            else:
                state = self._ext4(cut, draw, how, rng)
            digest = state.digest()
            if digest not in seen:
                seen.add(digest)
                out.append(state)
        return out

    def _state(self, cut: int, model: Model, how: str, tree: Tree) -> CrashState:
        dirs: list[str] = []
        files: dict[str, bytes] = {}
        for path, node in tree.paths():
            if tree.nodes[node].is_dir:
                dirs.append(path)
            else:
                files[path] = bytes(tree.nodes[node].content)
        return CrashState(cut, model, how, tuple(dirs), files)

    def _files(self, tree: Tree) -> Iterator[int]:
        seen: set[int] = set()
        for _path, node in tree.paths():
            if not tree.nodes[node].is_dir and node not in seen:
                seen.add(node)
                yield node

    def posix_state(self, cut: int, keep: Callable[[Op], bool], *, data: str = "all") -> CrashState:
        """One POSIX state chosen by hand: ``keep`` says which namespace operations not
        yet durable reached the disk; ``data`` is ``"all"`` (every byte issued) or
        ``"none"`` (only synced bytes). For regression tests."""
        return self._posix(cut, data, "chosen", random.Random(0), keep)

    def _posix(
        self,
        cut: int,
        draw: str,
        how: str,
        rng: random.Random,
        keep_op: Callable[[Op], bool] | None = None,
    ) -> CrashState:
        tree = self.initial.copy()
        lost: set[tuple[int, str]] = set()
        for op in self.namespace_ops:
            if op.seq >= cut:
                break
            names = {(op.parent, op.name)}
            if op.kind is Kind.RENAME:
                names.add((op.parent2, op.name2))
            if self.durable_from[op.seq] < cut:
                keep = True
            elif names & lost:
                keep = False
            elif keep_op is not None:
                keep = keep_op(op)
            else:
                keep = draw == "all" or (draw == "random" and rng.random() < 0.5)
            if not keep or not tree.apply_namespace(op):
                lost |= names
        for node in list(self._files(tree)):
            k_sync, k_issued = self.synced(node, cut), self.issued(node, cut)
            if draw == "none" or k_sync == k_issued:
                content = self.content(node, k_sync)
            elif draw == "all":
                content = self.content(node, k_issued)
            else:
                content = self._posix_tail(node, k_sync, k_issued, rng)
            tree.nodes[node].content = content
        return self._state(cut, Model.POSIX, how, tree)

    def _posix_tail(self, node: int, k_sync: int, k_issued: int, rng: random.Random) -> bytearray:
        ops = self.data_ops[node]
        k = rng.randint(k_sync, k_issued)
        if rng.random() < 0.25 and any(op.kind is Kind.STORE for op in ops[k_sync:k]):
            # Writeback of mapped pages in any subset: each recorded store is what the
            # mappings changed between two calls, kept or lost on its own.
            content = self.content(node, k_sync)
            for op in ops[k_sync:k]:
                if op.kind is not Kind.STORE or rng.random() < 0.5:
                    apply_data(content, op)
            return content
        content = self.content(node, k)
        torn = k < k_issued and ops[k].kind is Kind.WRITE and len(ops[k].data) > 1
        if torn and rng.random() < 0.5:
            apply_data(content, ops[k], cut=rng.randint(1, len(ops[k].data) - 1))
        return content

    def _ext4(self, cut: int, draw: str, how: str, rng: random.Random) -> CrashState:
        low = self.forced[cut]
        journal = {"none": low, "all": cut}.get(draw)
        if journal is None:
            journal = rng.randint(low, cut)
        tree = self.initial.copy()
        for op in self.namespace_ops:
            if op.seq >= journal:
                break
            tree.apply_namespace(op)
        torn: Op | None = None
        if journal < cut and draw == "random" and rng.random() < 0.5:
            first_out = self.ops[journal]
            if first_out.kind is Kind.WRITE and not first_out.in_place:
                torn = first_out
        for node in list(self._files(tree)):
            ops = self.data_ops.get(node, [])
            k_sync = self.synced(node, cut)
            k_issued = self.issued(node, cut)
            content = self.content(node, k_sync)
            for i in range(k_sync, k_issued):
                op = ops[i]
                if not op.in_place:
                    if op.seq < journal:
                        apply_data(content, op)
                    elif op is torn:
                        pages = [
                            p - op.offset
                            for p in range(
                                (op.offset // PAGE + 1) * PAGE, op.offset + len(op.data), PAGE
                            )
                        ]
                        if pages:
                            apply_data(content, op, cut=rng.choice(pages))
                elif draw == "all" or (draw == "random" and rng.random() < 0.5):
                    apply_data(content, op, clip=True)
            tree.nodes[node].content = content
        return self._state(cut, Model.EXT4_ORDERED, how, tree)


def choose_cuts(ops: list[Op], count: int, rng: random.Random) -> list[int]:
    """Up to ``count`` cut points, favouring the interesting ones.

    Interesting: just after a workload mark (an API call began or returned), just
    before and just after each fsync. The rest are drawn from all the others.
    """
    every = list(range(1, len(ops) + 1))
    if count >= len(every):
        return every
    interesting: set[int] = set()
    for op in ops:
        if op.kind is Kind.MARK:
            interesting.add(op.seq + 1)
        elif op.kind in (Kind.FSYNC, Kind.DIRSYNC):
            interesting.update((op.seq, op.seq + 1))
    interesting &= set(every)
    first = sorted(interesting)
    chosen = set(rng.sample(first, min(len(first), count * 2 // 3)))
    others = [c for c in every if c not in chosen]
    chosen.update(rng.sample(others, min(len(others), count - len(chosen))))
    return sorted(chosen)


def swap_commit_cuts(ops: list[Op]) -> list[int]:
    """Cut points just after a cleaning pass's commit point (the directory fsync that
    made its ``.log.swap`` names durable) where a swap stands for several old
    segments: the states a recovery must complete such a swap from. Random cuts
    rarely land there (power-loss D7 lived there).

    The pass renames every replaced ``.log`` ``.deleted`` after its commit point,
    then the swaps take their final names (``Log.replace_segments``): the swap based
    at B replaced the ``.deleted`` bases from B up to the next swap's base.
    """
    cuts: set[int] = set()
    pending: dict[int, list[int]] = {}  # directory node -> swap bases not committed
    for op in ops:
        if op.kind is Kind.RENAME and op.name2.endswith(".log.swap"):
            pending.setdefault(op.parent2, []).append(int(op.name2[:20]))
        elif op.kind is Kind.DIRSYNC and op.node in pending:
            swaps = sorted(pending.pop(op.node))
            retired = _retired_after(ops, op.seq, op.node)
            for i, base in enumerate(swaps):
                until = swaps[i + 1] if i + 1 < len(swaps) else 1 << 63
                if sum(base <= old < until for old in retired) > 1:
                    cuts.add(op.seq + 1)
    return sorted(cuts)


def _retired_after(ops: list[Op], commit: int, directory: int) -> list[int]:
    """The base offsets of the ``.log`` files of ``directory`` renamed ``.deleted``
    after the commit at ``commit``, until a swap takes its final name."""
    retired = []
    for op in ops[commit + 1 :]:
        if op.kind is not Kind.RENAME or op.parent != directory:
            continue
        if op.name.endswith(".log.swap"):
            break
        if op.name2.endswith(".log.deleted"):
            retired.append(int(op.name2[:20]))
    return retired


def recovery_cuts(ops: list[Op]) -> list[int]:
    """Every cut point just after a namespace operation or a sync of the first
    ``LogManager.open`` of a recording (the recovery of the state it started from):
    a second power cut during recovery must keep what the first run promised, and
    recovery's own steps are few enough to try each."""
    inside = False
    cuts = []
    for op in ops:
        if op.kind is Kind.MARK:
            text = str(op.event)
            if text.startswith("begin LogManager.open"):
                inside = True
            elif inside and text.startswith("end LogManager.open"):
                break
        elif inside and (op.kind in NAMESPACE_KINDS or op.kind in (Kind.FSYNC, Kind.DIRSYNC)):
            cuts.append(op.seq + 1)
    return cuts


def state_files(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` by relative path (to compare trees)."""
    out: dict[str, bytes] = {}
    for directory, _dirs, files in os.walk(root):
        for name in files:
            path = Path(directory, name)
            out[str(path.relative_to(root))] = path.read_bytes()
    return out
