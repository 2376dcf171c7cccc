"""Where each batch of an epoch comes from when DDP ranks and DataLoader workers share it, and the
loader state that says how far an epoch has gone: numpy and plain dicts only (the loader's one
pipeline, ``kit/pipeline.py``, and the samplers build on it: ``ds.iter`` and the torch adapters
deal ranks alike).

One epoch visits the positions of one order of all ``n`` items (``EpochOrder``: the same for any
world size). Global step s is the ``world_size × batch_size`` positions that follow ``start``
plus s such groups; rank r's batch s is the r-th run of ``batch_size`` of them. In DDP every rank
takes the same number of batches, so what a run has consumed after k steps is always a prefix of
the order: ``start + k · world_size · batch_size`` positions. That one number, the *global position*,
is what an elastic resume needs; any rank and worker layout can start there (``EpochLayout``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardsmith.kit.event_order import event_order
from shardsmith.kit.order import epoch_order
from shardsmith.kit.skips import SkipReport, check_entries

STATE = "shardsmith.epoch/2"        # marks a pipeline's state (``ds.iter``, an adapter, a sampler) in a loader's
STATE_V1 = "shardsmith.epoch/1"     # the adapters' and samplers' state before ``ds.iter`` shared it: loaded as v2
POSITION = "shardsmith.position/1"  # marks a global position (``global_position``, ``start=``)
# what must agree between a state and the adapter that loads it, and between the ranks of one run
IDENTITY = ("length", "order", "shuffle", "seed")
LAYOUT = ("batch_size", "world_size", "drop_last")
# torchdata's StatefulDataLoader: batches yielded after its last snapshot (replayed when it resumes)
_SINCE_SNAPSHOT = "_steps_since_snapshot"


class Positions:
    """The order ``0, 1, ..., n - 1`` without an array of it: what an unshuffled epoch visits, made a
    slice or a selection at a time (a mixture of 10**10 samples is read in order this way)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, where: slice | np.ndarray) -> np.ndarray:
        if isinstance(where, slice):
            return np.arange(*where.indices(self.n), dtype=np.int64)
        return np.asarray(where, dtype=np.int64).copy()


@dataclass(frozen=True)
class EpochOrder:
    """One epoch's visiting order of all items, before any rank split.

    ``block=None``: a per-item permutation (``epoch_order``); else contiguous blocks of ``block``
    items in shuffled order (``event_order``), so a batch is a few contiguous reads. Unshuffled,
    either is the items in order (``Positions``: no array).
    """

    block: int | None = None

    @property
    def name(self) -> str:
        return "permutation" if self.block is None else f"blocks:{self.block}"

    @classmethod
    def named(cls, name: str) -> EpochOrder:
        """The order a state names (``name``), or ValueError: a mixture's or a balanced order is none."""
        if name == "permutation":
            return cls()
        text = name.split(":", 1)[1] if name.startswith("blocks:") else ""
        if not text.isdecimal() or len(text) > 18 or int(text) < 1:
            raise ValueError(f"the order {name!r} is not an epoch's permutation (a mixture or balanced sampler)")
        return cls(int(text))

    def __call__(self, n: int, *, shuffle: bool, seed: int, epoch: int) -> np.ndarray | Positions:
        if not shuffle:
            return Positions(n)
        if self.block is None:
            return epoch_order(n, shuffle=shuffle, seed=seed, epoch=epoch)
        return event_order(n, shuffle=shuffle, seed=seed, epoch=epoch, block=self.block)


class EpochLayout:
    """Rank ``rank``'s batches of one epoch from global position ``start`` on.

    Every rank gets ``steps`` batches. With ``drop_last`` the positions after the last whole
    global step (fewer than ``world_size × batch_size``) are dropped; without it each rank also
    gets one short batch of ``rest // world_size`` and the last ``rest % world_size`` are dropped
    (never padding, never a rank with a batch more than another).
    """

    def __init__(self, *, total: int, start: int, batch_size: int | None, rank: int, world_size: int,
                 drop_last: bool) -> None:
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in range for world_size {world_size}")
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size={batch_size}: must be at least 1")
        if not 0 <= start <= total:
            raise ValueError(f"start={start} is outside the epoch's {total} positions")
        self.start, self.rank, self.world_size = start, rank, world_size
        self.batch = batch_size or 1
        step = world_size * self.batch
        self.full = (total - start) // step
        rest = total - start - self.full * step
        self.tail = 0 if drop_last else rest // world_size
        self.steps = self.full + (1 if self.tail else 0)

    def positions(self, step: int) -> slice:
        """The positions in the epoch's order of this rank's batch ``step``."""
        if step < self.full:
            first = self.start + (step * self.world_size + self.rank) * self.batch
            return slice(first, first + self.batch)
        first = self.start + self.full * self.world_size * self.batch + self.rank * self.tail
        return slice(first, first + self.tail)

    def positions_of(self, steps: range) -> np.ndarray:
        """The positions of this rank's batches ``steps`` (a range of step numbers), back to back:
        ``positions(s)`` of each, computed at once (a worker's whole share of an epoch)."""
        full = np.arange(steps.start, min(steps.stop, self.full), steps.step, dtype=np.int64) \
            if steps.start < self.full else np.zeros(0, np.int64)
        first = self.start + (full * self.world_size + self.rank) * self.batch
        out = (first[:, None] + np.arange(self.batch, dtype=np.int64)).reshape(-1)
        if self.tail and self.full in steps:
            tail = self.positions(self.full)
            out = np.concatenate([out, np.arange(tail.start, tail.stop, dtype=np.int64)])
        return out

    def position_after(self, steps: int) -> int:
        """The global position once every rank has taken ``steps`` batches."""
        if not 0 <= steps <= self.steps:
            raise ValueError(f"{steps} steps: this layout has {self.steps} batches per rank")
        if steps <= self.full:
            return self.start + steps * self.world_size * self.batch
        return self.start + self.full * self.world_size * self.batch + self.world_size * self.tail


_LIMIT = 1 << 62  # a count, position or seed in a state: 64-bit sums of them stay exact


def same(a: Any, b: Any) -> bool:
    """``a == b`` of the same type: a state's ``True`` is not a loader's ``1``, nor ``1.0`` its ``1``."""
    return type(a) is type(b) and a == b


def whole(value: Any, name: str, *, low: int = 0, high: int = _LIMIT) -> int:
    """A state's integer field: an ``int`` (a bool, a float or a numpy scalar is not one) in
    ``[low, high]`` (ValueError naming the field)."""
    if type(value) is not int or not low <= value <= high:
        raise ValueError(f"state_dict {name!r} {value!r} is not a whole number in [{_shown(low)}, {_shown(high)}]")
    return value


def _shown(bound: int) -> str:
    """A bound as a user reads it: ``2**62`` rather than its 19 digits."""
    return f"{'-' * (bound < 0)}2**{abs(bound).bit_length() - 1}" if abs(bound) > 1 << 32 else str(bound)


def is_state(value: Any) -> bool:
    """Whether ``value`` is a pipeline's saved state (of this version or the one before)."""
    return isinstance(value, Mapping) and value.get("shardsmith") in (STATE, STATE_V1)


def read_state(state: Any) -> dict[str, Any]:
    """A pipeline's saved state (``EpochStream.state_dict``: ``ds.iter``, an adapter, a sampler), every
    field checked before any number of it sizes a loop or an array: counts are ints within their bounds
    (the rank below the world size, the worker below the workers, the start inside the epoch), flags are
    bools, the order a name. Returns the fields (``shift`` 0 when absent, as states saved before it was
    kept). A ``shardsmith.epoch/1`` state (the adapters' before ``ds.iter`` shared their pipeline: the
    same layout and fields) loads as it is; a ``ds.iter`` state of before (``position``, no version) is
    taken where it means the same place (``legacy_iter_state``); any other version is refused by name."""
    if isinstance(state, Mapping) and "shardsmith" not in state and "position" in state:
        state = legacy_iter_state(state)
    if not isinstance(state, Mapping) or "shardsmith" not in state:
        raise ValueError("not a shardsmith loader state_dict (ds.iter, an adapter or a sampler)")
    if not is_state(state):
        raise ValueError(f"a state_dict of version {str(state['shardsmith'])[:60]!r}: this shardsmith reads "
                         f"{STATE!r} and {STATE_V1!r}")
    missing = [k for k in (*IDENTITY, *LAYOUT, "rank", "workers", "worker", "epoch", "start", "produced")
               if k not in state]
    if missing:
        raise ValueError(f"state_dict lacks {', '.join(missing)}")
    out: dict[str, Any] = {"length": whole(state["length"], "length"), "epoch": whole(state["epoch"], "epoch"),
                           "seed": whole(state["seed"], "seed", low=-(1 << 64), high=1 << 64),
                           "produced": whole(state["produced"], "produced")}
    if not isinstance(state["order"], str):
        raise ValueError(f"state_dict 'order' {state['order']!r} is not an order's name")
    out["order"] = state["order"]
    for key in ("shuffle", "drop_last"):
        if type(state[key]) is not bool:
            raise ValueError(f"state_dict {key!r} {state[key]!r} is not true or false")
        out[key] = state[key]
    batch = state["batch_size"]
    out["batch_size"] = None if batch is None else whole(batch, "batch_size", low=1)
    out["world_size"] = whole(state["world_size"], "world_size", low=1)
    out["rank"] = whole(state["rank"], "rank", high=out["world_size"] - 1)
    out["workers"] = whole(state["workers"], "workers", low=1)
    out["worker"] = whole(state["worker"], "worker", high=out["workers"] - 1)
    out["shift"] = whole(state.get("shift", 0), "shift", high=out["workers"] - 1)
    out["start"] = whole(state["start"], "start", high=out["length"])
    out["skipped"] = _skipped(state.get("skipped", []))
    return out


def _skipped(value: Any) -> list[Any]:
    """A state's ``skipped``: the samples its stream replaced (``kit/skips.py``), each record checked."""
    return check_entries(value)


def legacy_iter_state(state: Mapping[str, Any]) -> dict[str, Any]:
    """A ``ds.iter`` state saved before ``ds.iter`` ran on the adapters' pipeline (no version; its
    ``position`` counts the samples this rank had taken) as the state of today's pipeline, where it
    names the same samples: one rank (the epoch's order in batches, as now), or single samples over
    several ranks (a stride, which is today's layout with batches of one). Batches over several ranks
    were dealt by stride then (runs of batches now; blocks of events by contiguous stretches): such a
    state is refused in one line rather than resumed at other samples."""
    batch, world = state.get("batch_size"), state.get("world_size")
    position = whole(state.get("position"), "position")
    stretches = state.get("block") is not None and state.get("exact") is False
    if world != 1 and (batch is not None or stretches):
        raise ValueError(f"a ds.iter state_dict of before {STATE!r} (no version) with world_size={world!r} and "
                         f"batch_size={batch!r}: its ranks' shares differ from today's layout, so it cannot resume; "
                         f"restart the epoch, or from a position all ranks had reached (start=)")
    per = 1 if batch is None else whole(batch, "batch_size", low=1)
    block = state.get("block")
    order = "permutation" if block is None or state.get("exact") is True else f"blocks:{block}"
    kept = {k: state.get(k) for k in (*IDENTITY[:1], "shuffle", "seed", "epoch", "rank", *LAYOUT)}
    return {"shardsmith": STATE, **kept, "order": order, "workers": 1, "worker": 0, "start": 0, "shift": 0,
            "produced": -(-position // per), "skipped": []}


def worker_steps(state: Mapping[str, Any], layout: EpochLayout) -> int:
    """The most batches the worker of a ``read_state`` state can hand over in ``layout`` (its steps
    ``s ≡ worker - shift (mod workers)``): a ``produced`` beyond it is a state that lies."""
    return len(range((state["worker"] - state["shift"]) % state["workers"], layout.steps, state["workers"]))


def resolve_start(start: int | Mapping[str, Any] | None, *, epoch: int, identity: dict[str, Any]) -> tuple[int, int]:
    """``start=`` as (epoch, position): an int is a position in ``epoch``; a ``global_position``
    carries its own epoch and must come from the same dataset and order."""
    if start is None:
        return epoch, 0
    if isinstance(start, Mapping):
        if start.get("shardsmith") != POSITION:
            raise ValueError("start= takes an int or what shardsmith.torch.global_position returned")
        for key, value in identity.items():
            if not same(start.get(key), value):
                raise ValueError(f"start= was computed with {key}={start.get(key)!r}, this loader has {value!r}")
        return whole(start.get("epoch"), "epoch"), whole(start.get("position"), "position")
    if isinstance(start, bool) or not isinstance(start, (int, np.integer)):
        raise ValueError(f"start={start!r}: give an int or a global_position")
    return epoch, int(start)


def check_state(state: Mapping[str, Any], expect: dict[str, Any]) -> dict[str, Any]:
    """Refuse a state saved for another dataset, order or layout (one line, naming the option), or one
    whose fields are not what a loader saves (``read_state``); returns its fields."""
    fields = read_state(state)
    for key, value in expect.items():
        if not same(fields.get(key), value):
            raise ValueError(f"state_dict was saved with {key}={fields.get(key)!r}, this loader has {value!r}")
    return fields


def adapter_states(state: Any) -> Iterator[Mapping[str, Any]]:
    """Every adapter or sampler state inside a loader's state (torchdata nests them per worker), in
    order. Walked with a stack, not recursion: a state nested a thousand deep is not a RecursionError,
    and one that holds itself is walked once."""
    stack, seen = [state], set()
    while stack:
        value = stack.pop()
        if isinstance(value, Mapping | list | tuple):
            if id(value) in seen:
                continue
            seen.add(id(value))
        if isinstance(value, Mapping):
            if is_state(value):
                yield value
            else:
                stack.extend(reversed(list(value.values())))
        elif isinstance(value, list | tuple):
            stack.extend(reversed(value))


def _rank_steps(state: Mapping[str, Any]) -> tuple[dict[str, Any], int]:
    """(the rank's options, batches its loader has yielded) from one rank's saved state."""
    found = [read_state(s) for s in adapter_states(state)]
    if not found:
        raise ValueError("no shardsmith adapter or sampler state in this loader state")
    first = found[0]
    options = {k: first[k] for k in (*IDENTITY, *LAYOUT, "epoch", "start", "rank", "workers")}
    for other in found[1:]:
        for key, value in options.items():
            if not same(other[key], value):
                raise ValueError(f"the workers' states of one loader disagree on {key}")
    if len(found) != options["workers"] or sorted(s["worker"] for s in found) != list(range(len(found))):
        raise ValueError(f"a loader with {options['workers']} workers holds states of workers "
                         f"{sorted(s['worker'] for s in found)}")
    since = whole(state.get(_SINCE_SNAPSHOT, 0), _SINCE_SNAPSHOT) if isinstance(state, Mapping) else 0
    if options["batch_size"] is None and (options["workers"] > 1 or since):
        raise ValueError("a global position needs the adapter to make the batches (batch_size=B on the adapter, "
                         "batch_size=None on the DataLoader) when samples are spread over workers")
    layout = _layout(options)
    for s in found:
        if s["produced"] > worker_steps(s, layout):
            raise ValueError(f"state_dict 'produced' {s['produced']} is more batches than worker {s['worker']} "
                             f"has in its epoch")
    return options, sum(s["produced"] for s in found) + since


def _layout(options: Mapping[str, Any]) -> EpochLayout:
    return EpochLayout(total=options["length"], start=options["start"], batch_size=options["batch_size"],
                       rank=options["rank"], world_size=options["world_size"], drop_last=options["drop_last"])


def global_position(states: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One global position in the epoch's order from the saved loader states of the ranks.

    ``states``: each rank's ``StatefulDataLoader.state_dict()`` (or an adapter's or sampler's own),
    one per rank; any subset of the ranks will do, since in DDP every rank has taken the same number
    of batches k and together they have consumed exactly the first ``start + k · world_size ·
    batch_size`` positions of the epoch's order. States of ranks at different steps are refused
    (they were saved at different times: with unequal counts no prefix is consumed exactly).
    Pass the result as ``start=`` to an adapter or sampler of any rank and worker layout.
    """
    states = [states] if isinstance(states, Mapping) else list(states)
    if not states:
        raise ValueError("global_position needs the loader state of at least one rank")
    ranks: dict[int, tuple[dict[str, Any], int]] = {}
    for state in states:
        options, steps = _rank_steps(state)
        if options["rank"] in ranks:
            raise ValueError(f"two states of rank {options['rank']}")
        ranks[options["rank"]] = (options, steps)
    (options, steps), *others = ranks.values()
    for other, _ in others:
        for key in (*IDENTITY, *LAYOUT, "epoch", "start"):
            if not same(other[key], options[key]):
                raise ValueError(f"the ranks' states disagree on {key}: they are not of one run")
    counts = {rank: s for rank, (_, s) in sorted(ranks.items())}
    if len(set(counts.values())) > 1:
        raise ValueError(f"the ranks are at different steps {counts}: in DDP every rank takes the same number "
                         f"of batches; give the states all ranks saved at one step")
    skipped = sorted((e for s in states for a in adapter_states(s) for e in read_state(a)["skipped"]
                      if e["epoch"] == options["epoch"]), key=lambda e: e["index"])
    return {"shardsmith": POSITION, **{k: options[k] for k in IDENTITY}, "epoch": options["epoch"],
            "position": _layout(options).position_after(steps), "skipped": skipped}


def skip_report(states: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> SkipReport:
    """The skips recorded in loader states: a ``StatefulDataLoader``'s (its workers' adapters keep
    them, not the main process's copy), an adapter's or ``ds.iter``'s; a list of them (the ranks')."""
    if isinstance(states, Mapping) and isinstance(states.get("skipped"), list) and "position" in states:
        found = check_entries(states["skipped"])  # a global position: the skips before it
    else:
        found = [e for s in adapter_states(states) for e in check_entries(s.get("skipped", []))]
    once = {(e["epoch"], e["index"]): e for e in found}  # a sample is skipped once an epoch
    return SkipReport(tuple(dict(once[k]) for k in sorted(once)))
