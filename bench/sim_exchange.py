"""The exchange between scatter and gather at 1-100 TB, simulated with the engine's own planning code.

    python bench/sim_exchange.py                       # ~5-10 min: measured to 100 GB / 100 ranks, then fitted
    python bench/sim_exchange.py --quick               # seconds: toy sizes (a test runs it)
    python bench/sim_exchange.py --sizes 1GB/2,10GB/10 --targets 1TB/100 --json out.json

A run of ``pack-tokens --ranks W`` at the default options (``sim_workload.py``: the corpus, its tasks
and documents, the sizing rules) is simulated with part files whose payloads are holes: every unit
(scatter, the plan, gather, finalize) runs the engine's real code on them in a process of its own
(``sim_meter.py``), and prints per unit the files it opened in the scratch folder, the metadata it
read (what its read calls returned, less the payload), its peak resident memory and its CPU
seconds, and per run the bytes through the shared folder in all. Where a size cannot run here in
minutes (1 TB needs ~100 GB of memory a unit today), each figure is a fit of the measured ones
against what drives it (segments, parts, opens of parts: counted at every size from the sizing
rules and a sample of synthetic parts), with the fit and its points printed: every figure is
measured ``[m]``, counted from the exchange's own tables ``[c]``, or fitted ``[f]``.

Each exchange is a column: today's (``sim_today.py``); issue 43's rework adds its own class
(``sim_meter.Exchange``) to ``exchanges_for``.
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
from dataclasses import asdict
from pathlib import Path
from statistics import median
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402
import orjson  # noqa: E402
from harness import key_figure  # noqa: E402
from sim_meter import METRICS, Exchange, Law, Paths, UnitRef, add_up, figure, in_child, measured  # noqa: E402
from sim_today import Today  # noqa: E402
from sim_workload import Workload, gib  # noqa: E402

from shardsmith.engine.outdir import work_path  # noqa: E402


def exchanges_for(args: argparse.Namespace) -> list[Exchange]:
    """The exchanges the table compares, one column each (issue 43's rework adds its own here)."""
    return [Today(heads="all" if args.all_heads else "plan")]

SIZES = "1GB/2,3GB/3,10GB/10,30GB/30,100GB/100"
TARGETS = "1TB/100,10TB/1000,100TB/4000"
QUICK = {"sizes": "25MB/2,100MB/4", "memory": "16MB", "shard_tokens": 1_000_000, "sample_tasks": 4}
HEADS = {"opens": "opens", "meta_read": "metadata read", "rss": "peak RSS", "cpu": "CPU s"}


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
    if metric in ("meta_read", "rss", "bytes"):
        return gib(max(0.0, value))
    if metric == "cpu":
        return f"{value:,.1f}" if value >= 10 else f"{value:.2f}"
    if value >= 10_000_000:
        return f"{value / 1e6:,.0f}M"
    return f"{value:,.0f}"


# ---------------------------------------------------------------- running a size


def run_size(ex: Exchange, wl: Workload, root: Path, *, sample: int, sample_tasks: int, keep: bool) -> dict[str, Any]:
    """Every unit of ``wl`` that the simulation runs for ``ex``, measured: the setup units (every
    scatter, the planner), then ``sample`` gather units in all (the busiest and the last rank
    first), then finalize. The scratch folder is removed after (unless ``keep``)."""
    out = root / f"{ex.name}-{wl.input_bytes}-{wl.ranks}" / "out"
    paths = Paths(out=out, scratch=work_path(out))
    if not wl.tasks:  # planned here, once: every unit's process inherits them
        raise ValueError(f"{wl.name}: no tasks")
    shutil.rmtree(out.parent, ignore_errors=True)
    out.mkdir(parents=True)
    started = time.perf_counter()
    units = []
    prepared = in_child(lambda: ex.prepare(wl))
    try:
        for unit in ex.setup_units(wl):
            units.append(measured(ex, wl, paths, unit, prepared))
        every = next(u["counted"].pop("every_rank") for u in units if "every_rank" in u["counted"])
        done = {u["rank"] for u in units if u["kind"] == "gather"}
        for rank in pick_ranks(every, done, sample):
            units.append(measured(ex, wl, paths, UnitRef("gather", rank), prepared))
        units.append(measured(ex, wl, paths, UnitRef("finalize"), prepared))
    finally:
        if not keep:
            shutil.rmtree(out.parent, ignore_errors=True)
    shape = in_child(lambda: ex.shape(wl, sample_tasks=sample_tasks))
    return {"workload": workload_dict(wl), "built": True, "units": units, "every_rank": every, "shape": shape,
            "seconds": time.perf_counter() - started}


def pick_ranks(every: list[dict[str, Any]], done: set[int], sample: int) -> list[int]:
    """Gather ranks to measure besides ``done``: the busiest (most opens of parts), the last rank
    (often one with no shard to write at the default shard size), then the next busiest."""
    order = sorted((r for r in range(len(every)) if r not in done), key=lambda r: (-every[r]["pairs"], r))
    chosen = order[:1] + [r for r in [len(every) - 1] if r not in done and r not in order[:1]]
    chosen += [r for r in order if r not in chosen]
    return chosen[:max(0, sample - len(done))]


def workload_dict(wl: Workload) -> dict[str, Any]:
    return {"name": wl.name, "input_bytes": wl.input_bytes, "ranks": wl.ranks, "memory": wl.memory,
            "workers": wl.workers, "shard_tokens": wl.shard_tokens, "tasks": wl.task_count, "buckets": wl.buckets,
            "chunk_bytes": wl.sizing.chunk_bytes, "group_bytes": wl.sizing.group_bytes,
            "group_budget": wl.group_budget}


# ---------------------------------------------------------------- rows, fits, totals


def claimed(ex: Exchange) -> set[tuple[str, int, str]]:
    """(kind, rank, phase): phases that a row of their own shows, left out of their unit's row."""
    return {(r.kind, r.rank, r.phase) for r in ex.rows if r.phase is not None and r.rank is not None}


def row_units(ex: Exchange, row_label: str, units: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, float]]]:
    """The units a row is made of, each with its counts for the row (a phase, or the unit less the
    phases other rows show)."""
    row = next(r for r in ex.rows if r.label == row_label)
    taken = claimed(ex)
    out = []
    for u in units:
        if u["kind"] != row.kind or (row.rank is not None and u["rank"] != row.rank):
            continue
        if row.phase is not None:
            if row.phase in u["phases"]:
                out.append((u, u["phases"][row.phase]))
            continue
        phases = [p for name, p in u["phases"].items() if (u["kind"], u["rank"], name) not in taken]
        out.append((u, add_up(phases)))
    return out


def measured_rows(ex: Exchange, units: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each row's figures at a size that ran: the busiest unit of its kind (most opens; scatter: most
    CPU), or its phase; a phase row has no memory of its own."""
    rows = {}
    for row in ex.rows:
        got = row_units(ex, row.label, units)
        if not got:
            continue
        key = "cpu" if row.kind == "scatter" else "opens"
        unit, counts = max(got, key=lambda uc: (figure(uc[1], key), -uc[0]["rank"]))
        rows[row.label] = {"unit": unit["unit"], "source": "m",
                           **{m: (None if (m == "rss" and row.phase) else figure(counts, m)) for m in METRICS}}
    return rows


def law_points(ex: Exchange, law: Law, sizes: list[dict[str, Any]]) -> list[tuple[list[float], float]]:
    """(predictors, measured) of every measured unit a law covers: the row's counts of the unit, or
    its phase ``law.phase`` (unless a row of its own shows that phase of that unit)."""
    points = []
    taken = claimed(ex)
    row = next(r for r in ex.rows if r.label == law.row)
    for size in sizes:
        for u, counts in row_units(ex, law.row, size["units"]):
            if law.phase is not None and row.phase is None:
                if law.phase not in u["phases"] or (u["kind"], u["rank"], law.phase) in taken:
                    continue
                counts = u["phases"][law.phase]
            exact = float(u["counted"][law.exact]) if law.exact else 0.0
            points.append(([float(u["counted"][name]) for name in law.names], float(figure(counts, law.metric)) - exact))
    return points


def fit(points: list[tuple[list[float], float]]) -> dict[str, Any]:
    """Least squares y = a + b . x (a predictor that does not vary over the points is left out: its
    coefficient 0), with the largest residual as a share of the largest y."""
    xs = np.array([p[0] for p in points], dtype=np.float64).reshape(len(points), -1)
    ys = np.array([p[1] for p in points], dtype=np.float64)
    varies = [j for j in range(xs.shape[1]) if np.ptp(xs[:, j]) > 0]
    design = np.column_stack([np.ones(len(ys)), xs[:, varies]])
    coef = np.linalg.lstsq(design, ys, rcond=None)[0] if len(ys) else np.zeros(1)
    b = [0.0] * xs.shape[1]
    for j, c in zip(varies, coef[1:]):
        b[j] = float(c)
    pred = design @ coef
    worst = float(np.max(np.abs(pred - ys)) / max(float(np.max(np.abs(ys))), 1e-9)) if len(ys) else 0.0
    return {"a": float(coef[0]), "b": b, "n": len(points), "worst": worst, "points": points}


def fits_of(ex: Exchange, sizes: list[dict[str, Any]]) -> dict[tuple[str, str, str | None], dict[str, Any]]:
    out = {}
    for law in ex.laws:
        pts = law_points(ex, law, sizes)
        if pts:
            out[(law.row, law.metric, law.phase)] = {**fit(pts), "law": asdict(law)}
    return out


def predicted(ex: Exchange, fits: dict, shape: dict[str, float], row: str, metric: str,
              phases: tuple[str | None, ...] | None = None, *, times: float = 1.0) -> float | None:
    """A row's figure at a size from its laws' fits (only the laws of ``phases``, when given); the
    intercept ``times`` over (the reads of ``times`` units added up)."""
    laws = [law for law in ex.laws if law.row == row and law.metric == metric
            and (phases is None or law.phase in phases)]
    if not laws or any((law.row, law.metric, law.phase) not in fits for law in laws):
        return None
    total = 0.0
    for law in laws:
        f = fits[(law.row, law.metric, law.phase)]
        total += times * f["a"] + sum(b * shape[name] for b, name in zip(f["b"], law.names))
        total += shape[law.exact] if law.exact else 0.0
    return max(0.0, total)


def fitted_rows(ex: Exchange, fits: dict, shape: dict[str, float]) -> dict[str, dict[str, Any]]:
    return {row.label: {"unit": row.label, "source": "f", **{m: predicted(ex, fits, shape, row.label, m)
                                                            for m in METRICS}} for row in ex.rows}


def measured_totals(ex: Exchange, size: dict[str, Any]) -> dict[str, Any]:
    """The run in all at a size that ran: every unit measured, and gather ranks that were not run
    counted (their tables and plan as the median measured rank's, their reads from ``every_rank``)."""
    units, every = size["units"], size["every_rank"]
    gathered = {u["rank"] for u in units if u["kind"] == "gather"}
    unit_sum = add_up([p for u in units for p in u["phases"].values()])
    others = [r for r in range(len(every)) if r not in gathered]
    fixed = [add_up([p for name, p in u["phases"].items() if name != "read"]) for u in units
             if u["kind"] == "gather" and not u["counted"].get("computed_plan")]
    med = {k: median(f[k] for f in fixed) for k in ("opens", "bytes_read")} if fixed else {"opens": 0, "bytes_read": 0}
    opens = unit_sum["opens"] + sum(med["opens"] + every[r]["pairs"] for r in others)
    read = unit_sum["bytes_read"] + sum(med["bytes_read"] + every[r]["heads"] + every[r]["payload"] for r in others)
    payload_read = unit_sum["payload_read"] + sum(every[r]["payload"] for r in others)
    output = sum(r["tokens"] for r in every) * 2
    written = unit_sum["bytes_written"] + unit_sum["payload_written"] + output
    return {"opens": opens, "meta_read": read - payload_read, "bytes": read + written,
            "parts_written": unit_sum["bytes_written"] + unit_sum["payload_written"], "payload_read": payload_read,
            "output": output, "units": 2 * len(every) + 1, "source": "m+c" if others else "m"}


def fitted_totals(ex: Exchange, fits: dict, shape: dict[str, float], wl: Workload) -> dict[str, Any]:
    """The run in all at a fitted size: W scatter units, W gather units' fixed phases (all but
    ``read``), the reads of every rank together (``all_read_*``: each group once, and again where
    two ranges share it; the fit's intercept once a rank that reads), the plan once, finalize."""
    active = shape["active_ranks"]
    every = {**shape, **{k.removeprefix("all_"): v for k, v in shape.items() if k.startswith("all_")}}

    def total(metric: str) -> float | None:
        parts = [predicted(ex, fits, shape, "scatter", metric),
                 predicted(ex, fits, shape, "gather", metric, ("tables", "plan")),
                 predicted(ex, fits, every, "gather", metric, ("read",), times=active),
                 predicted(ex, fits, shape, "plan", metric), predicted(ex, fits, shape, "finalize", metric)]
        if any(p is None for p in parts):
            return None
        scatter, fixed, reads, plan, fin = parts  # type: ignore[misc]
        return wl.ranks * (scatter + fixed) + reads + plan + fin

    meta = total("meta_read")
    part_bytes = shape["payload"] + 24 * shape["docs"] + shape["footer_bytes"]
    output = shape["tokens"] * 2
    return {"opens": total("opens"), "meta_read": meta,
            "bytes": None if meta is None else part_bytes + meta + shape["all_read_payload"] + output,
            "parts_written": part_bytes, "payload_read": shape["all_read_payload"], "output": output,
            "units": 2 * wl.ranks + 1, "source": "f"}


# ---------------------------------------------------------------- printing


def print_table(results: dict[str, Any], exchanges: list[Exchange]) -> None:
    names = [ex.name for ex in exchanges]
    cols = [(m, n) for m in METRICS for n in names]
    head = f"{'size':<22}{'unit':<10}" + "".join(f"{(HEADS[m] + (' ' + n if len(names) > 1 else '')):>15}"
                                                for m, n in cols) + "  src"
    print(head)
    print("-" * len(head))
    for entry in results["sizes"]:
        name = entry["workload"]["name"]
        for k, row in enumerate(exchanges[0].rows):
            cells, src = [], set()
            for metric, ex_name in cols:
                r = entry["rows"][ex_name].get(row.label)
                cells.append(amount(metric, None if r is None else r[metric]))
                if r is not None:
                    src.add(r["source"])
            print(f"{name if k == 0 else '':<22}{row.label:<10}" + "".join(f"{c:>15}" for c in cells)
                  + f"  {'/'.join(sorted(src))}")
        for ex_name in names:
            t = entry["totals"][ex_name]
            print(f"{'':<22}{'in all':<10}{ex_name}: {amount('opens', t['opens'])} opens, "
                  f"{amount('bytes', t['meta_read'])} of metadata read, {amount('bytes', t['bytes'])} through the "
                  f"shared folder (parts written {amount('bytes', t['parts_written'])}, payload read "
                  f"{amount('bytes', t['payload_read'])}, tokens written {amount('bytes', t['output'])}), "
                  f"{t['units']:,} units  [{t['source']}]")
    print()


def print_shapes(results: dict[str, Any]) -> None:
    """Each size as its exchange cuts it: from the parts themselves where it ran, else from the sizing
    rules and a sample of synthetic parts (what the fits are evaluated at)."""
    cols = (("tasks", "parts"), ("buckets", "buckets"), ("segments", "segments"), ("footers", "footer_bytes"),
            ("shards", "shards"), ("groups", "groups"), ("bkt/group", "buckets_per_group"),
            ("parts/group", "parts_per_group"), ("active", "active_ranks"))
    print(f"{'size':<22}" + "".join(f"{c:>13}" for c, _ in cols) + "  from")
    for entry in results["sizes"]:
        for ex_name, s in entry["shape"].items():
            counted = entry.get("counted", {}).get(ex_name, {})
            cells = [amount("bytes" if key == "footer_bytes" else "opens", counted.get(key, s.get(key)))
                     for _, key in cols]
            print(f"{entry['workload']['name']:<22}" + "".join(f"{c:>13}" for c in cells) + "  "
                  + (f"{ex_name}: the parts" if counted else f"{ex_name}: rules + {s['sampled_tasks']:.0f} sampled parts"))
    print()


def shape_checks(entry: dict[str, Any], ex_name: str) -> dict[str, tuple[float, float]]:
    """At a size that ran: (from the sizing rules and sampled parts, counted from the parts) of
    what the fits are evaluated at elsewhere."""
    shape, units = entry["shape"][ex_name], entry["units"][ex_name]
    planner = [u for u in units if u["counted"].get("computed_plan")]
    got = {"segments": (shape["segments"], entry["counted"][ex_name]["segments"]),
           "footer_bytes": (shape["footer_bytes"], entry["counted"][ex_name]["footer_bytes"]),
           "read_pairs": (shape["read_pairs"], max(r["pairs"] for r in entry["every_rank"]))}
    if planner:
        got["plan_pairs"] = (shape["plan_pairs"], planner[0]["counted"]["plan_pairs"])
    return got


def print_checks(results: dict[str, Any]) -> None:
    for entry in results["sizes"]:
        if not entry["built"]:
            continue
        for ex_name in entry["shape"]:
            line = ", ".join(f"{key} {amount('opens', a)} ({b and 100 * (a - b) / b:+.1f}%)"
                             for key, (a, b) in shape_checks(entry, ex_name).items())
            print(f"  {entry['workload']['name']}, {ex_name}, from the rules and sampled parts against the parts: {line}")
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
            print(f"  {where:<15}{law['metric']:<10} = {f['a']:.4g} {terms};  n={f['n']}, worst residual "
                  f"{100 * f['worst']:.1f}% of the largest y;  [{shown}{' ...' if len(pts) > 6 else ''}]")
    print()


# ---------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default=None, help=f"sizes run here, SIZE/RANKS (default {SIZES})")
    ap.add_argument("--targets", default=TARGETS, help="sizes fitted from those (default %(default)s)")
    ap.add_argument("--memory", default=None, help="pack-tokens --memory (default 1GB)")
    ap.add_argument("--shard-tokens", type=int, default=None, help="pack-tokens --shard-tokens (default 1e9)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sample-ranks", type=int, default=3, help="gather units measured per size")
    ap.add_argument("--sample-tasks", type=int, default=None, help="synthetic parts sampled per size (default 150)")
    ap.add_argument("--all-heads", action="store_true", help="today: write every segment's heads (~4 kB of disk "
                    "a segment: 50 GB at 100 GB), not only those the plan reads (elsewhere the gather sorts zeros)")
    ap.add_argument("--quick", action="store_true", help="toy sizes in seconds (a test runs it)")
    ap.add_argument("--workdir", type=Path, default=None, help="where the sparse part files go (default: a temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the part files of each size")
    ap.add_argument("--json", type=Path, default=None, help="write every figure, unit and fit there")
    args = ap.parse_args(argv)
    preset = QUICK if args.quick else {"sizes": SIZES, "memory": "1GB", "shard_tokens": 1_000_000_000,
                                       "sample_tasks": 150}
    args.sizes = args.sizes or preset["sizes"]
    args.memory = args.memory or preset["memory"]
    args.shard_tokens = args.shard_tokens or preset["shard_tokens"]
    args.sample_tasks = args.sample_tasks or preset["sample_tasks"]
    built, targets = workloads(args.sizes, args), workloads(args.targets, args)
    exchanges = exchanges_for(args)
    started = time.perf_counter()
    print(f"sim_exchange: pack-tokens --memory {args.memory} --shard-tokens {args.shard_tokens:,} --workers 1 a "
          f"unit, one split; {len(built)} sizes run, {len(targets)} fitted; load average {os.getloadavg()[0]:.2f}",
          flush=True)
    root = args.workdir or Path(tempfile.mkdtemp(prefix="sim-exchange-"))
    root.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"options": {k: str(v) for k, v in vars(args).items()}, "sizes": [], "fits": {}}
    runs: dict[str, list[dict[str, Any]]] = {ex.name: [] for ex in exchanges}
    try:
        for wl in built:
            entry: dict[str, Any] = {"workload": workload_dict(wl), "built": True, "rows": {}, "totals": {},
                                     "shape": {}, "counted": {}, "units": {}, "seconds": {}}
            for ex in exchanges:
                got = run_size(ex, wl, root, sample=args.sample_ranks, sample_tasks=args.sample_tasks, keep=args.keep)
                runs[ex.name].append(got)
                entry["rows"][ex.name] = measured_rows(ex, got["units"])
                entry["totals"][ex.name] = measured_totals(ex, got)
                entry["shape"][ex.name] = got["shape"]
                planner = next(u for u in got["units"] if u["counted"].get("segments") is not None
                               and u["kind"] != "scatter")
                entry["counted"][ex.name] = {k: planner["counted"][k] for k in
                                             ("segments", "footer_bytes", "shards", "groups") if k in planner["counted"]}
                entry["units"][ex.name] = got["units"]
                entry["every_rank"] = got["every_rank"]
                entry["seconds"][ex.name] = got["seconds"]
            results["sizes"].append(entry)
            print(f"  {wl.name}: {', '.join(f'{n} {s:.0f} s' for n, s in entry['seconds'].items())}", flush=True)
        fits = {ex.name: fits_of(ex, runs[ex.name]) for ex in exchanges}
        results["fits"] = {name: list(f.values()) for name, f in fits.items()}
        for wl in targets:
            entry = {"workload": workload_dict(wl), "built": False, "rows": {}, "totals": {}, "shape": {}}
            for ex in exchanges:
                shape = in_child(lambda ex=ex, wl=wl: ex.shape(wl, sample_tasks=args.sample_tasks))
                entry["shape"][ex.name] = shape
                entry["rows"][ex.name] = fitted_rows(ex, fits[ex.name], shape)
                entry["totals"][ex.name] = fitted_totals(ex, fits[ex.name], shape, wl)
            results["sizes"].append(entry)
    finally:
        if args.workdir is None:
            shutil.rmtree(root, ignore_errors=True)
    results["seconds"] = time.perf_counter() - started
    print()
    print_shapes(results)
    print_checks(results)
    print_table(results, exchanges)
    print("[m] measured in the unit's own process; [c] counted from the exchange's own tables (gather ranks not "
          "run); [f] fitted: a + b x per phase, x counted at that size from the sizing rules and sampled parts.")
    for ex in exchanges:
        print("\n".join(f"  {r.label}: {r.note}" for r in ex.rows if r.note))
    print()
    print_fits(results)
    for entry in results["sizes"]:
        for ex in exchanges:
            g = entry["rows"][ex.name].get("gather")
            if g is None or not entry["workload"]["input_bytes"] >= 10**11:
                continue
            key_figure(f"{ex.name}, {entry['workload']['name']}, a gather unit",
                       f"{amount('opens', g['opens'])} opens, {amount('meta_read', g['meta_read'])} of metadata, "
                       f"{amount('rss', g['rss'])} peak RSS, {amount('cpu', g['cpu'])} CPU s [{g['source']}]")
    print(f"\nsim_exchange: {results['seconds']:.0f} s; load average {os.getloadavg()[0]:.2f}")
    if args.json is not None:
        args.json.write_bytes(orjson.dumps(results, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_INDENT_2))
    return results


if __name__ == "__main__":
    main()
