"""The exchange between scatter and gather at 1-100 TB, simulated with the engine's own code.

    python bench/sim_exchange.py                       # ~18 min here: measured to 100 GB / 100 ranks, then fitted
    python bench/sim_exchange.py --quick               # seconds: toy sizes (a test runs it)
    python bench/sim_exchange.py --sizes 1GB/2,10GB/10 --targets 1TB/100 --json out.json
    python bench/sim_exchange.py --exchange today,NAME # exchanges side by side (``EXCHANGES``)

A run of ``pack-tokens --ranks W`` at the default options (``sim_workload.py``: the corpus, its tasks
and documents, the sizing rules) is simulated with part files whose payloads are holes. The gather
units and finalize are the engine's own (``engine/shuffle/run.convert_units`` for a ``GatherUnit`` or the
``FinalizeUnit``, with pack-tokens' writer, whose shard files are holes); the scatter units are
simulated (they write what the engine's scatter writes, less the payload: tokenizing the input is
not the exchange). Each unit runs in a process of its own and is measured (``sim_meter.py``): the
files it opens in the scratch folder, the metadata it reads (what its read calls return, less the
payload), its peak resident memory, its CPU seconds; and the run in all: opens, metadata, and bytes
through the shared folder (parts written, metadata and payload read, shards written).

First a self-check (``sim_check.py``): a real ``pack-tokens`` run of 1 MB, its stages as processes,
against the simulation of the same documents, unit by unit; the table is printed only if every count
is equal (``--no-check`` skips it).

Sizes that cannot run here in minutes (at 1 TB a gather unit needs ~100 GB of memory today) are
fitted: per phase, a + b . x against what drives it (parts, segments, footer bytes, opens of parts:
counted at every size from the sizing rules and a sample of synthetic parts), from the units
measured at the sizes that ran. Every figure says where it comes from: ``m`` measured, ``f`` fitted,
``m+f`` measured with a fitted part (finalize's ``gather.finish`` where the gather ranks not run left
no pieces; the reads of gather ranks not run, in the totals), with the fit's worst error over the
measured sizes. Modelled, and said so: the documents (``sim_workload.py``: sizes measured on
``corpus.py``'s JSONL), the scatter (not its CPU or memory: it does not tokenize), the payloads (zeros),
the heads of groups no measured unit looks into (zeros).

Each exchange is a column: today's (``sim_today.Today``); ``json``, today's with the JSON footers
and ``Segment`` tables it had before issue 43's binary footers (``sim_json.py``: a frozen copy, so
``--exchange json,today`` shows what they changed); the rest of issue 43's rework subclasses
``sim_meter.Exchange`` and registers itself in ``EXCHANGES``.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from statistics import median
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402
import orjson  # noqa: E402
from harness import key_figure  # noqa: E402
from sim_check import check, print_check  # noqa: E402
from sim_json import JsonFooters  # noqa: E402
from sim_meter import (  # noqa: E402
    METRICS,
    Exchange,
    Law,
    Paths,
    Row,
    UnitRef,
    add_up,
    figure,
    in_child,
    measured,
    pick_ranks,
)
from sim_today import Today  # noqa: E402
from sim_workload import TOKEN_BYTES, Workload, gib  # noqa: E402

from shardsmith.engine.output.outdir import work_path  # noqa: E402

# the exchanges a table can show, by name: today's; the one before issue 43's binary footers (a frozen
# copy of its JSON footers and Segment tables: ``sim_json.py``), to show what they changed
EXCHANGES: dict[str, Callable[[argparse.Namespace], Exchange]] = {
    "today": lambda args: Today(heads="all" if args.all_heads else "plan"),
    "json": lambda args: JsonFooters(heads="all" if args.all_heads else "plan"),
}
SIZES = "1GB/2,3GB/3,10GB/10,30GB/30,100GB/100"
TARGETS = "1TB/100,10TB/1000,100TB/4000"
QUICK = {"sizes": "25MB/2,100MB/4", "memory": "16MB", "shard_tokens": 1_000_000, "sample_tasks": 4}
HEADS = {"opens": "opens", "meta_read": "metadata read", "rss": "peak RSS", "cpu": "CPU s"}
TOTALS = ("opens", "meta_read", "payload_read", "written")  # the run in all (``shared``: their sum but opens)


def size_of(text: str) -> int:
    m = re.fullmatch(r"\s*([\d.]+)\s*([kMGT]?)B?\s*", text)
    if not m:
        raise ValueError(f"not a size: {text!r} (e.g. 10GB)")
    return int(float(m.group(1)) * 10 ** (3 * " kMGT".index(m.group(2) or " ")))


def workloads(spec: str, args: argparse.Namespace) -> list[Workload]:
    """``1GB/2,10GB/10``: input size / ranks, at the options of ``args``."""
    out = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        size, _, ranks = item.partition("/")
        out.append(Workload(input_bytes=size_of(size), ranks=int(ranks or 1), memory=size_of(args.memory),
                            shard_tokens=args.shard_tokens, seed=args.seed))
    return out


def amount(metric: str, value: float | None) -> str:
    """A figure as the table shows it."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if metric in ("meta_read", "rss", "bytes", "written", "payload_read", "shared"):
        return gib(max(0.0, value))
    if metric == "cpu":
        return f"{value:,.0f}" if value >= 100 else f"{value:.1f}" if value >= 10 else f"{value:.2f}"
    if value >= 10_000_000:
        return f"{value / 1e6:,.0f}M"
    return f"{value:,.0f}"


# ---------------------------------------------------------------- running a size


def run_size(ex: Exchange, wl: Workload, root: Path, *, sample: int, sample_tasks: int, keep: bool) -> dict[str, Any]:
    """Every unit of ``wl`` that the simulation runs for ``ex``, measured: the setup units (every
    scatter, the planner), then the gather units ``prepare`` chose (``sample`` in all: the busiest
    and the last rank first), then finalize (its ``finish`` only if every gather rank that writes
    shards was run: the others left no pieces). The scratch folder is removed after (unless ``keep``)."""
    out = root / f"{ex.name}-{wl.input_bytes}-{wl.ranks}" / "out"
    paths = Paths(out=out, scratch=work_path(out))
    shutil.rmtree(out.parent, ignore_errors=True)
    out.mkdir(parents=True)
    started = time.perf_counter()
    units = []
    prepared = in_child(lambda: ex.prepare(wl, sample=sample))
    try:
        setup = ex.setup_units(wl)
        for unit in setup:
            units.append(measured(ex, wl, paths, unit, prepared))
        every = next(u["counted"].pop("every_rank") for u in units if "every_rank" in u["counted"])
        done = {u.rank for u in setup if u.kind == "gather"}
        chosen = prepared.get("gather_ranks")
        if chosen is None:
            chosen = pick_ranks([r["pairs"] for r in every], done=done, sample=sample)
        for rank in chosen:
            units.append(measured(ex, wl, paths, UnitRef("gather", rank), prepared))
        ran = done | set(chosen)
        writers = {r for r, e in enumerate(every) if e["ranges"]}
        skip = frozenset() if writers <= ran else frozenset({"finish"})
        units.append(measured(ex, wl, paths, UnitRef("finalize"), prepared, skip=skip))
    finally:
        if not keep:
            shutil.rmtree(out.parent, ignore_errors=True)
    shape = in_child(lambda: ex.shape(wl, sample_tasks=sample_tasks))
    return {"workload": workload_dict(wl), "units": units, "every_rank": every, "shape": shape,
            "seconds": time.perf_counter() - started}


def workload_dict(wl: Workload) -> dict[str, Any]:
    return {"name": wl.name, "input_bytes": wl.input_bytes, "ranks": wl.ranks, "memory": wl.memory,
            "workers": wl.workers, "shard_tokens": wl.shard_tokens, "tasks": wl.task_count, "buckets": wl.buckets,
            "chunk_bytes": wl.sizing.chunk_bytes, "group_bytes": wl.sizing.group_bytes,
            "group_budget": wl.group_budget}


# ---------------------------------------------------------------- a row's units and phases


def claimed(ex: Exchange) -> set[tuple[str, int, str]]:
    """(kind, rank, phase): phases that a row of their own shows, left out of their unit's row."""
    return {(r.kind, r.rank, r.phase) for r in ex.rows if r.phase is not None and r.rank is not None}


def row_of(ex: Exchange, label: str) -> Row:
    return next(r for r in ex.rows if r.label == label)


def row_counts(ex: Exchange, row: Row, u: dict[str, Any], phase: str | None = None) -> dict[str, float] | None:
    """A unit's counts for a row: its phase ``phase`` (or the row's own phase), or all its phases
    less those another row shows; None where the unit is not the row's or lacks the phase."""
    if u["kind"] != row.kind or (row.rank is not None and u["rank"] != row.rank):
        return None
    want = row.phase or phase
    if want is not None:
        if want not in u["phases"] or (row.phase is None and (u["kind"], u["rank"], want) in claimed(ex)):
            return None
        return u["phases"][want]
    return add_up([p for name, p in u["phases"].items() if (u["kind"], u["rank"], name) not in claimed(ex)])


def unit_figure(ex: Exchange, row: Row, u: dict[str, Any], metric: str, phase: str | None = None) -> float | None:
    counts = row_counts(ex, row, u, phase)
    if counts is None:
        return None
    if metric == "rss":
        return None if row.phase is not None else float(u["rss"])
    return float(figure(counts, metric))


# ---------------------------------------------------------------- fits


def law_points(ex: Exchange, law: Law, sizes: list[dict[str, Any]]) -> list[tuple[list[float], float]]:
    """(predictors, measured) of every measured unit a law covers."""
    points = []
    row = row_of(ex, law.row)
    for size in sizes:
        for u in size["units"]:
            y = unit_figure(ex, row, u, law.metric, law.phase)
            if y is None:
                continue
            exact = float(u["counted"][law.exact]) if law.exact else 0.0
            points.append(([float(u["counted"][name]) for name in law.names], y - exact))
    return points


def fit(points: list[tuple[list[float], float]]) -> dict[str, Any]:
    """Least squares y = a + b . x with b >= 0 (more opens, documents or bytes never cost less: a
    predictor whose coefficient comes out negative, from noise or from two predictors that grow
    together, is left out and the rest fitted again; so is one that does not vary over the points),
    with the largest residual as a share of the largest y."""
    xs = np.array([p[0] for p in points], dtype=np.float64).reshape(len(points), -1)
    ys = np.array([p[1] for p in points], dtype=np.float64)
    varies = [j for j in range(xs.shape[1]) if np.ptp(xs[:, j]) > 0]
    if not varies:  # a constant: the median of the points (a unit's stray read does not move it)
        a = float(np.median(ys))
        worst = float(np.max(np.abs(ys - a)) / max(float(np.max(np.abs(ys))), 1e-9))
        return {"a": a, "b": [0.0] * xs.shape[1], "n": len(points), "worst": worst, "points": points}
    while True:
        design = np.column_stack([np.ones(len(ys)), xs[:, varies]])
        coef = np.linalg.lstsq(design, ys, rcond=None)[0]
        if not varies or coef[1:].min() >= 0:
            break
        varies.pop(int(np.argmin(coef[1:])))
    b = [0.0] * xs.shape[1]
    for j, c in zip(varies, coef[1:]):
        b[j] = float(c)
    pred = design @ coef
    worst = float(np.max(np.abs(pred - ys)) / max(float(np.max(np.abs(ys))), 1e-9))
    return {"a": float(coef[0]), "b": b, "n": len(points), "worst": worst, "points": points}


def fits_of(ex: Exchange, sizes: list[dict[str, Any]]) -> dict[tuple[str, str, str | None], dict[str, Any]]:
    out = {}
    for law in ex.laws:
        pts = law_points(ex, law, sizes)
        if pts:
            out[(law.row, law.metric, law.phase)] = {**fit(pts), "law": asdict(law)}
    return out


def predicted(ex: Exchange, fits: dict, x: dict[str, float], row: str, metric: str,
              phases: tuple[str | None, ...] | None = None, *, times: float = 1.0) -> float | None:
    """A row's figure from its laws' fits at the predictors ``x`` (only the laws of ``phases``, when
    given); the intercept ``times`` over (the reads of ``times`` units added up)."""
    laws = [law for law in ex.laws if law.row == row and law.metric == metric
            and (phases is None or law.phase in phases)]
    if not laws or any((law.row, law.metric, law.phase) not in fits for law in laws):
        return None
    total = 0.0
    for law in laws:
        f = fits[(law.row, law.metric, law.phase)]
        total += times * f["a"] + sum(b * x[name] for b, name in zip(f["b"], law.names))
        total += x[law.exact] if law.exact else 0.0
    return max(0.0, total)


# ---------------------------------------------------------------- rows


def measured_rows(ex: Exchange, size: dict[str, Any], fits: dict) -> dict[str, dict[str, Any]]:
    """Each row's figures at a size that ran: its busiest measured unit (most opens), or its phase;
    a phase the unit did not run (finalize's ``finish`` without every range's pieces) from the fits
    at the unit's own counts (source ``m+f``). A phase row has no memory of its own; the scatter's
    CPU and memory are not simulated."""
    rows = {}
    for row in ex.rows:
        got = [u for u in size["units"] if row_counts(ex, row, u) is not None]
        if not got:
            continue
        unit = max(got, key=lambda u: (unit_figure(ex, row, u, "opens"), -u["rank"]))
        cells: dict[str, Any] = {"unit": unit["unit"], "source": "m"}
        for metric in METRICS:
            if metric == "rss" and row.phase is not None or metric in ("rss", "cpu") and row.kind == "scatter":
                cells[metric] = None
                continue
            value = unit_figure(ex, row, unit, metric)
            missing = tuple(law.phase for law in ex.laws if law.row == row.label and law.metric == metric
                            and law.phase is not None and law.phase not in unit["phases"])
            if missing and metric != "rss":
                extra = predicted(ex, fits, {**size["shape"], **unit["counted"]}, row.label, metric, missing)
                value = None if value is None or extra is None else value + extra
                cells["source"] = "m+f"
            cells[metric] = value
        rows[row.label] = cells
    return rows


def fitted_rows(ex: Exchange, fits: dict, shape: dict[str, float], errors: dict[tuple[str, str], float]
                ) -> dict[str, dict[str, Any]]:
    out = {}
    for row in ex.rows:
        cells: dict[str, Any] = {"unit": row.label, "source": "f", "error": {}}
        for metric in METRICS:
            if metric == "rss" and row.phase is not None or metric in ("rss", "cpu") and row.kind == "scatter":
                cells[metric] = None
                continue
            cells[metric] = predicted(ex, fits, shape, row.label, metric)
            cells["error"][metric] = errors.get((row.label, metric))
        out[row.label] = cells
    return out


def fit_errors(ex: Exchange, fits: dict, sizes: list[dict[str, Any]]) -> dict[tuple[str, str], float]:
    """Per (row, metric): the worst deviation, over the sizes that ran, of the fitted figure (the
    fits evaluated at that size's counts from the sizing rules and sampled parts, as beyond) from
    the measured one, as a share of the largest measured figure (as the fits' residuals are given):
    what the extrapolated figures' own formula misses where it can be checked."""
    worst: dict[tuple[str, str], float] = {}
    largest: dict[tuple[str, str], float] = {}
    for size in sizes:
        for label, cells in size["rows"].items():
            for metric in METRICS:
                got = cells.get(metric)
                want = predicted(ex, fits, size["shape"], label, metric)
                if got is None or want is None:
                    continue
                key = (label, metric)
                worst[key] = max(worst.get(key, 0.0), abs(want - got))
                largest[key] = max(largest.get(key, 0.0), abs(got))
    return {key: worst[key] / largest[key] for key in worst if largest[key] > 0}


def holdout(ex: Exchange, sizes: list[dict[str, Any]]) -> dict[str, Any]:
    """The largest size that ran, extrapolated from the others as the targets are from all of them
    (fits of the smaller sizes at its counts from the rules and sampled parts), against what was
    measured there: how far one step of extrapolation goes wrong where it can be checked."""
    fits = fits_of(ex, sizes[:-1])
    last = sizes[-1]
    out: dict[str, Any] = {"size": last["workload"]["name"], "rows": {}}
    for label, cells in last["rows"].items():
        out["rows"][label] = {}
        for metric in METRICS:
            got, want = cells.get(metric), predicted(ex, fits, last["shape"], label, metric)
            if got is not None and want is not None and got > 0:
                out["rows"][label][metric] = {"measured": got, "extrapolated": want, "error": (want - got) / got}
    return out


def print_holdout(results: dict[str, Any]) -> None:
    for ex_name, h in results.get("holdout", {}).items():
        print(f"{ex_name}: {h['size']} extrapolated from the smaller sizes alone, against its measured figures:")
        for label, cells in h["rows"].items():
            shown = ", ".join(f"{metric} {amount(metric, c['extrapolated'])} for {amount(metric, c['measured'])} "
                              f"({100 * c['error']:+.0f}%)" for metric, c in cells.items())
            print(f"  {label:<10}{shown}")
    print()


# ---------------------------------------------------------------- the run in all


def unit_totals(u: dict[str, Any]) -> dict[str, float]:
    t = add_up(list(u["phases"].values()))
    return {"opens": t["opens"], "meta_read": figure(t, "meta_read"), "payload_read": t["payload_read"],
            "written": t["bytes_written"] + t["holes_written"]}


def rank_predictors(r: dict[str, Any]) -> dict[str, float]:
    """A gather rank's predictors of its reads, counted from the engine's tables (``every_rank``)."""
    return {"read_pairs": r["pairs"], "read_heads": r["heads"], "read_docs": r["docs"], "read_payload": r["payload"],
            "punch_pairs": r["punches"], "read_output": r["tokens"] * TOKEN_BYTES, "shards": r["shards"]}


def measured_totals(ex: Exchange, size: dict[str, Any], fits: dict) -> dict[str, Any]:
    """The run in all at a size that ran: every unit measured, a finish not run fitted, and each
    gather rank not run as the median measured rank in its fixed phases (all but ``read``) and its
    reads from the fits at its own counts from the engine's tables (``every_rank``)."""
    units, every = size["units"], size["every_rank"]
    total = dict.fromkeys(TOTALS, 0.0)
    for u in units:
        for k, v in unit_totals(u).items():
            total[k] += v
    source = "m"
    fin = next(u for u in units if u["kind"] == "finalize")
    if "finish" not in fin["phases"]:
        x = {**size["shape"], **fin["counted"]}
        for k in ("opens", "meta_read", "written"):
            total[k] += predicted(ex, fits, x, "finalize", k, ("finish",)) or 0.0
        source = "m+f"
    gathered = {u["rank"] for u in units if u["kind"] == "gather"}
    others = [r for r in range(len(every)) if r not in gathered]
    fixed = [unit_totals({"phases": {k: p for k, p in u["phases"].items() if k != "read"}}) for u in units
             if u["kind"] == "gather" and not u["counted"].get("computed_plan")]
    for r in others:
        x = rank_predictors(every[r])
        for k in ("opens", "meta_read", "written"):
            total[k] += median(f[k] for f in fixed) if fixed else 0.0
            total[k] += predicted(ex, fits, x, "gather", k, ("read",)) if every[r]["ranges"] else 0.0
        total["payload_read"] += every[r]["payload"]
        source = "m+f"
    return {**total, "shared": total["meta_read"] + total["payload_read"] + total["written"],
            "output": sum(r["tokens"] for r in every) * TOKEN_BYTES, "units": 2 * len(every) + 2, "source": source}


def fitted_totals(ex: Exchange, fits: dict, shape: dict[str, float], wl: Workload) -> dict[str, Any]:
    """The run in all at a fitted size: W scatter units (the parts they write counted from the
    rules), W gather units' fixed phases, the reads of every rank together (``all_read_*``: each
    group once, and again where two ranges share it; the intercept once a rank that writes), the
    plan once, finalize."""
    active = shape["active_ranks"]
    every = {**shape, **{k.removeprefix("all_"): v for k, v in shape.items() if k.startswith("all_")}}

    def total(metric: str) -> float | None:
        parts = [predicted(ex, fits, shape, "scatter", metric) if metric != "written" else 0.0,
                 predicted(ex, fits, shape, "gather", metric, ("tables", "plan")),
                 predicted(ex, fits, every, "gather", metric, ("read",), times=active),
                 predicted(ex, fits, shape, "plan", metric), predicted(ex, fits, shape, "finalize", metric)]
        if any(p is None for p in parts):
            return None
        scatter, fixed, reads, plan, fin = parts  # type: ignore[misc]
        return wl.ranks * (scatter + fixed) + reads + plan + fin

    got = {k: total(k) for k in ("opens", "meta_read", "written")}
    part_bytes = shape["payload"] + 24 * shape["docs"] + shape["footer_bytes"]
    written = None if got["written"] is None else got["written"] + part_bytes
    shared = None if got["meta_read"] is None or written is None else got["meta_read"] + shape["all_read_payload"] + written
    return {"opens": got["opens"], "meta_read": got["meta_read"], "payload_read": shape["all_read_payload"],
            "written": written, "shared": shared, "output": shape["tokens"] * TOKEN_BYTES, "units": 2 * wl.ranks + 2,
            "source": "f"}


# ---------------------------------------------------------------- printing


def cell(metric: str, row: dict[str, Any] | None) -> str:
    if row is None or row.get(metric) is None:
        return "-"
    err = (row.get("error") or {}).get(metric)
    return amount(metric, row[metric]) + ("" if row["source"] != "f" or err is None else f" ±{100 * err:.0f}%")


def print_table(results: dict[str, Any], exchanges: list[Exchange]) -> None:
    names = [ex.name for ex in exchanges]
    cols = [(m, n) for m in METRICS for n in names]
    width = 18
    head = f"{'size':<22}{'unit':<10}" + "".join(f"{(HEADS[m] + (' ' + n if len(names) > 1 else '')):>{width}}"
                                                for m, n in cols) + "  src"
    print(head)
    print("-" * len(head))
    for entry in results["sizes"]:
        name = entry["workload"]["name"]
        for k, row in enumerate(exchanges[0].rows):
            cells, src = [], []
            for metric, ex_name in cols:
                r = entry["rows"][ex_name].get(row.label)
                cells.append(cell(metric, r))
                if r is not None and r["source"] not in src:
                    src.append(r["source"])
            print(f"{name if k == 0 else '':<22}{row.label:<10}" + "".join(f"{c:>{width}}" for c in cells)
                  + f"  {'/'.join(src)}")
        for ex_name in names:
            t = entry["totals"][ex_name]
            print(f"{'':<22}{'in all':<10}{ex_name}: {amount('opens', t['opens'])} opens, "
                  f"{amount('bytes', t['meta_read'])} of metadata read; {amount('bytes', t['shared'])} through the "
                  f"shared folder (that metadata, {amount('bytes', t['payload_read'])} of payload read, "
                  f"{amount('bytes', t['written'])} written: parts, {amount('bytes', t['output'])} of shards, pieces); "
                  f"{t['units']:,} units  [{t['source']}]")
    print()


def print_shapes(results: dict[str, Any]) -> None:
    """Each size as its exchange cuts it, from the sizing rules and a sample of synthetic parts (what
    the fits are evaluated at); where it ran, ``shape_checks`` compares them with the parts."""
    cols = (("tasks", "parts"), ("buckets", "buckets"), ("segments", "segments"), ("footers", "footer_bytes"),
            ("shards", "all_shards"), ("groups", "groups"), ("bkt/group", "buckets_per_group"),
            ("parts/group", "parts_per_group"), ("active", "active_ranks"))
    print(f"{'size':<22}" + "".join(f"{c:>13}" for c, _ in cols) + "  from")
    for entry in results["sizes"]:
        for ex_name, s in entry["shape"].items():
            cells = [amount("bytes" if key == "footer_bytes" else "opens", s.get(key)) for _, key in cols]
            print(f"{entry['workload']['name']:<22}" + "".join(f"{c:>13}" for c in cells)
                  + f"  {ex_name}: rules + {s['sampled_tasks']:.0f} sampled parts")
    print()


def shape_checks(entry: dict[str, Any], ex_name: str) -> dict[str, tuple[float, float]]:
    """At a size that ran: (from the sizing rules and sampled parts, counted from the parts) of
    what the fits are evaluated at elsewhere."""
    shape, units = entry["shape"][ex_name], entry["units"][ex_name]
    planner = next(u for u in units if u["counted"].get("computed_plan"))
    every = entry["every_rank"][ex_name]
    return {"segments": (shape["segments"], planner["counted"]["segments"]),
            "footer_bytes": (shape["footer_bytes"], planner["counted"]["footer_bytes"]),
            "read_pairs": (shape["read_pairs"], max(r["pairs"] for r in every)),
            "read_segments": (shape["read_segments"], max(r["segments"] for r in every)),
            "plan_pairs": (shape["plan_pairs"], planner["counted"]["plan_pairs"]),
            "punch_pairs": (shape["punch_pairs"], max(r["punches"] for r in every))}


def print_checks(results: dict[str, Any]) -> None:
    print("the counts the fits are evaluated at, from the sizing rules and sampled parts, against those of "
          "the engine's tables where the size ran:")
    for entry in results["sizes"]:
        if not entry["built"]:
            continue
        for ex_name in entry["shape"]:
            line = ", ".join(f"{key} {amount('opens', a)} ({b and 100 * (a - b) / b:+.1f}%)"
                             for key, (a, b) in shape_checks(entry, ex_name).items())
            print(f"  {entry['workload']['name']}, {ex_name}: {line}")
    print()


def print_fits(results: dict[str, Any]) -> None:
    for ex_name, fits in results["fits"].items():
        print(f"fits of {ex_name}'s measured units: a + b x (x: counted in each unit), with the points (x, y)")
        for f in fits:
            law = f["law"]
            where = f"{law['row']}" + (f"/{law['phase']}" if law["phase"] else "")
            names = [n for n in law["predictor"].split("+") if n]
            terms = " ".join(f"{b:+.4g} {n}" for b, n in zip(f["b"], names)) or "(constant)"
            terms += f" + {law['exact']}" if law["exact"] else ""
            pts = sorted({(tuple(round(v, 3) for v in x), round(y, 4)) for x, y in f["points"]})
            shown = ", ".join(f"({'/'.join(f'{v:,.0f}' for v in x)}: {y:,.4g})"
                              for x, y in (pts if len(pts) <= 6 else pts[:3] + pts[-3:]))
            print(f"  {where:<16}{law['metric']:<10} = {f['a']:.4g} {terms};  n={f['n']}, worst residual "
                  f"{100 * f['worst']:.1f}% of the largest y;  [{shown}{' ...' if len(pts) > 6 else ''}]")
    print()


def print_notes(exchanges: list[Exchange]) -> None:
    print("m: measured in the unit's own process; f: fitted (a + b x per phase, x counted at that size from the "
          "sizing rules and sampled parts), ± its worst error on the sizes measured; m+f: measured, with a part "
          "fitted (a finish not run; gather ranks not run, in the totals). Metadata read: what the unit's read "
          "calls returned less the payload (footers, heads, plans, pieces). Scatter CPU and memory: not simulated "
          "(the real unit tokenizes: ~97 MB/s a core, bench/README 'Executors'). CPU seconds swing by tens of "
          "percent with the machine's load.")
    for ex in exchanges:
        print("\n".join(f"  {ex.name}, {r.label}: {r.note}" for r in ex.rows if r.note))
    print()


# ---------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--exchange", default="today", help=f"exchanges side by side, of {', '.join(EXCHANGES)}")
    ap.add_argument("--sizes", default=None, help=f"sizes run here, SIZE/RANKS (default {SIZES})")
    ap.add_argument("--targets", default=TARGETS, help="sizes fitted from those (default %(default)s)")
    ap.add_argument("--memory", default=None, help="pack-tokens --memory (default 1GB)")
    ap.add_argument("--shard-tokens", type=int, default=None, help="pack-tokens --shard-tokens (default 1e9)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sample-ranks", type=int, default=3, help="gather units measured per size")
    ap.add_argument("--sample-tasks", type=int, default=None, help="synthetic parts sampled per size (default 150)")
    ap.add_argument("--all-heads", action="store_true", help="today: write every segment's heads (~4 kB of disk "
                    "a segment: 50 GB at 100 GB), not only those the plan and the measured units read")
    ap.add_argument("--quick", action="store_true", help="toy sizes in seconds (a test runs it)")
    ap.add_argument("--no-check", action="store_true", help="skip the self-check against a real run")
    ap.add_argument("--workdir", type=Path, default=None, help="where the sparse part files go (default: a temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the part files of each size")
    ap.add_argument("--json", type=Path, default=None, help="write every figure, unit and fit there")
    ap.add_argument("--replot", type=Path, default=None, help="the table again from an earlier run's --json: its "
                    "measured units fitted again (to --targets), nothing run")
    args = ap.parse_args(argv)
    earlier = orjson.loads(args.replot.read_bytes()) if args.replot else None
    if earlier is not None:  # its sizes and options; its units are not run again
        options = earlier["options"]
        args.memory, args.shard_tokens, args.seed = options["memory"], int(options["shard_tokens"]), int(options["seed"])
        args.sample_tasks = int(options["sample_tasks"])
        args.sizes = ",".join(f"{e['workload']['input_bytes']}B/{e['workload']['ranks']}" for e in earlier["sizes"]
                              if e["built"])
        args.no_check = True
    unknown = [n for n in args.exchange.split(",") if n not in EXCHANGES]
    if unknown:
        ap.error(f"--exchange: no exchange {', '.join(unknown)} (there are: {', '.join(EXCHANGES)})")
    preset = QUICK if args.quick else {"sizes": SIZES, "memory": "1GB", "shard_tokens": 1_000_000_000,
                                       "sample_tasks": 150}
    args.sizes = args.sizes or preset["sizes"]
    args.memory = args.memory or preset["memory"]
    args.shard_tokens = args.shard_tokens or preset["shard_tokens"]
    args.sample_tasks = args.sample_tasks or preset["sample_tasks"]
    built, targets = workloads(args.sizes, args), workloads(args.targets, args)
    exchanges = [EXCHANGES[n](args) for n in args.exchange.split(",")]
    started = time.perf_counter()
    print(f"sim_exchange: pack-tokens --memory {args.memory} --shard-tokens {args.shard_tokens:,} --workers 1 a "
          f"unit, one split; exchanges {', '.join(ex.name for ex in exchanges)}; {len(built)} sizes run, "
          f"{len(targets)} fitted; load average {os.getloadavg()[0]:.2f}", flush=True)
    results: dict[str, Any] = {"options": {k: str(v) for k, v in vars(args).items()}, "sizes": [], "fits": {}}
    root = args.workdir or Path(tempfile.mkdtemp(prefix="sim-exchange-"))
    root.mkdir(parents=True, exist_ok=True)
    if earlier is not None and "check" in earlier:
        results["check"] = earlier["check"]
        print(f"(from {args.replot}: its self-check and measured units, fitted again)")
        print_check(results["check"])
    if not args.no_check:
        results["check"] = check(workdir=root)
        print_check(results["check"])
        if not results["check"]["ok"]:
            raise SystemExit("sim_exchange: the self-check failed: the simulation does not count what a real run does")
    runs: dict[str, list[dict[str, Any]]] = {ex.name: [] for ex in exchanges}
    if earlier is not None:
        for e in (e for e in earlier["sizes"] if e["built"]):
            for ex in exchanges:
                runs[ex.name].append({"workload": e["workload"], "units": e["units"][ex.name],
                                      "every_rank": e["every_rank"][ex.name], "shape": e["shape"][ex.name],
                                      "seconds": e["seconds"][ex.name]})
        built = []
    try:
        for wl in built:
            for ex in exchanges:
                runs[ex.name].append(run_size(ex, wl, root, sample=args.sample_ranks, sample_tasks=args.sample_tasks,
                                              keep=args.keep))
            took = ", ".join(f"{n} {r[-1]['seconds']:.0f} s" for n, r in runs.items())
            print(f"  {wl.name}: {took}", flush=True)
    finally:
        if args.workdir is None:
            shutil.rmtree(root, ignore_errors=True)
    fits = {ex.name: fits_of(ex, runs[ex.name]) for ex in exchanges}
    results["fits"] = {name: list(f.values()) for name, f in fits.items()}
    for k, wl in enumerate(workloads(args.sizes, args)):
        entry: dict[str, Any] = {"workload": workload_dict(wl), "built": True, "rows": {}, "totals": {}, "shape": {},
                                 "units": {}, "every_rank": {}, "seconds": {}}
        for ex in exchanges:
            got = runs[ex.name][k]
            got["rows"] = entry["rows"][ex.name] = measured_rows(ex, got, fits[ex.name])
            entry["totals"][ex.name] = measured_totals(ex, got, fits[ex.name])
            entry["shape"][ex.name], entry["units"][ex.name] = got["shape"], got["units"]
            entry["every_rank"][ex.name], entry["seconds"][ex.name] = got["every_rank"], got["seconds"]
        results["sizes"].append(entry)
    errors = {ex.name: fit_errors(ex, fits[ex.name], runs[ex.name]) for ex in exchanges}
    if len(runs[exchanges[0].name]) > 2:
        results["holdout"] = {ex.name: holdout(ex, runs[ex.name]) for ex in exchanges}
    for wl in targets:
        entry = {"workload": workload_dict(wl), "built": False, "rows": {}, "totals": {}, "shape": {}}
        for ex in exchanges:
            shape = in_child(lambda ex=ex, wl=wl: ex.shape(wl, sample_tasks=args.sample_tasks))
            entry["shape"][ex.name] = shape
            entry["rows"][ex.name] = fitted_rows(ex, fits[ex.name], shape, errors[ex.name])
            entry["totals"][ex.name] = fitted_totals(ex, fits[ex.name], shape, wl)
        results["sizes"].append(entry)
    results["seconds"] = time.perf_counter() - started
    print()
    print_shapes(results)
    print_checks(results)
    print_table(results, exchanges)
    print_notes(exchanges)
    print_holdout(results)
    print_fits(results)
    for entry in results["sizes"]:
        for ex in exchanges:
            g = entry["rows"][ex.name].get("gather")
            if g is None or entry["workload"]["input_bytes"] < 10**12:
                continue
            key_figure(f"{ex.name}, {entry['workload']['name']}, a gather unit",
                       f"{cell('opens', g)} opens, {cell('meta_read', g)} of metadata, {cell('rss', g)} peak RSS, "
                       f"{cell('cpu', g)} CPU s [{g['source']}]")
    print(f"\nsim_exchange: {results['seconds']:.0f} s; load average {os.getloadavg()[0]:.2f}")
    if args.json is not None:
        args.json.write_bytes(orjson.dumps(results, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_INDENT_2))
    return results


if __name__ == "__main__":
    main()
