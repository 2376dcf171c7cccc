"""Synthetic event files for the demo and the benchmarks: IceCube-like pulses in a ROOT file.

Real detector data are large and not ours to ship, so the demo and the benchmarks make their
own: per event an id and a direction, and a variable number of pulses (time, charge, the
position of the optical module that saw it, an auxiliary flag) sharing one counter. The file
is written in pieces, so it holds several baskets (TTree) or clusters (RNTuple) like a real one,
and the same seed and sizes give the same values.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

_STRINGS, _DOMS_PER_STRING = 86, 60


def _geometry() -> np.ndarray:
    """(5160, 3) float32 module positions in metres: 86 strings on a 125 m triangular grid, 60
    modules 17 m apart on each (fixed, not drawn from the seed)."""
    side = math.ceil(math.sqrt(_STRINGS))
    i = np.arange(_STRINGS)
    row, col = i // side, i % side
    x = (col + 0.5 * (row % 2) - side / 2) * 125.0
    y = (row - side / 2) * 125.0 * math.sqrt(3) / 2
    z = np.linspace(500.0, -500.0, _DOMS_PER_STRING)
    xyz = np.empty((_STRINGS, _DOMS_PER_STRING, 3), dtype=np.float32)
    xyz[:, :, 0] = x[:, None]
    xyz[:, :, 1] = y[:, None]
    xyz[:, :, 2] = z[None, :]
    return xyz.reshape(-1, 3)


def _piece(rng: np.random.Generator, first: int, n: int, mean_pulses: float, geometry: np.ndarray) -> dict:
    """``n`` events starting at id ``first`` as columns: scalars and flat pulses with counts."""
    counts = (1 + rng.poisson(max(mean_pulses - 1, 0.0), n)).astype(np.int64)
    total = int(counts.sum())
    starts = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=starts[1:])
    steps = rng.exponential(40.0, total)  # ns between pulses; times rise within each event
    cum = np.cumsum(steps)
    before = np.concatenate([[0.0], cum])[starts[:-1]]
    time = (9000.0 + cum - np.repeat(before, counts)).astype(np.float32)
    dom = rng.integers(0, len(geometry), total)
    return {
        "event_id": np.arange(first, first + n, dtype=np.int64),
        "azimuth": rng.uniform(0.0, 2 * math.pi, n).astype(np.float32),
        "zenith": np.arccos(rng.uniform(-1.0, 1.0, n)).astype(np.float32),
        "counts": counts,
        "time": time,
        "charge": rng.lognormal(0.0, 0.6, total).astype(np.float32),
        "dom_x": geometry[dom, 0],
        "dom_y": geometry[dom, 1],
        "dom_z": geometry[dom, 2],
        "auxiliary": rng.random(total) < 0.1,
    }


def make_icecube_like(path: str | Path, *, events: int, mean_pulses: float, seed: int, rntuple: bool = False,
                      events_per_basket: int = 10_000) -> Path:
    """Write ``events`` IceCube-like events to a ROOT file (TTree ``events``, or an RNTuple).

    Fields: ``event_id`` (int64), ``azimuth``/``zenith`` (float32), ``n_pulses`` (int32) and the
    pulses ``pulses_time``, ``pulses_charge``, ``pulses_dom_x``/``_y``/``_z`` (float32) and
    ``pulses_auxiliary`` (bool), which share one counter (the TTree's ``n_pulses`` branch; the
    RNTuple's ``pulses`` collection). About ``mean_pulses`` pulses per event (at least one).
    """
    import awkward as ak
    import uproot

    path = Path(path)
    rng = np.random.default_rng(seed)
    geometry = _geometry()
    pulse_fields = ("time", "charge", "dom_x", "dom_y", "dom_z", "auxiliary")

    def batch(first: int, n: int, gen: np.random.Generator = rng) -> dict:
        cols = _piece(gen, first, n, mean_pulses, geometry)
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(cols["counts"], out=offsets[1:])
        pulses = ak.zip({f: ak.Array(ak.contents.ListOffsetArray(ak.index.Index64(offsets),
                                                                ak.contents.NumpyArray(cols[f])))
                         for f in pulse_fields})
        data = {"event_id": cols["event_id"], "azimuth": cols["azimuth"], "zenith": cols["zenith"]}
        if rntuple:  # a TTree gets its n_pulses branch from the writer, as the counter of pulses
            data["n_pulses"] = cols["counts"].astype(np.int32)
        data["pulses"] = pulses
        return data

    empty = batch(0, 0, np.random.default_rng(0))  # only its types: the seeded stream stays untouched
    pieces = [(a, min(events_per_basket, events - a)) for a in range(0, events, max(1, events_per_basket))]
    with uproot.recreate(path) as out:
        if rntuple:
            writer = out.mkrntuple("events", ak.zip(empty, depth_limit=1).layout.form)
            for a, n in pieces:
                writer.extend(ak.zip(batch(a, n), depth_limit=1))
        else:
            types = {k: v.type if isinstance(v, ak.Array) else v.dtype for k, v in empty.items()}
            tree = out.mktree("events", types, counter_name=lambda name: f"n_{name}")
            for a, n in pieces:
                tree.extend(batch(a, n))
    return path
