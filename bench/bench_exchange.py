"""The exchange measured on real staged runs: what each unit opens, reads and holds, against W.

    python bench/bench_exchange.py [--mb 1000] [--worlds 2,8,32,64] [--small-memory 16MB --small-at 8]
                                   [--shards 64] [--dask 2,8] [--workdir /tmp/shardsmith-bench] [--json F] [--quick]

`pack-tokens` of a synthetic JSONL corpus (bench/corpus.py, the byte-level BPE of
bench/make_tokenizers.py), `--shard-tokens` set for about ``--shards`` shards (so that at the largest W
every gather rank has a shard to write), run as its stages, each a process of its own with
`--workers 1` (bench_stages.py's simulated ranks, one after another): every `--stage scatter --rank
R`, then `--stage plan`, every `--stage gather --rank R`, then `--stage finalize`; at the default
`--memory` (1 GB) for each W, and at `--small-memory` for one W (the memory bound on the tasks).

Each stage process runs the CLI under a meter (``child``: this module imported by ``python -c``,
then ``runpy`` of ``shardsmith``), which records, for the process:
  * opens of files in the scratch folder (``.OUT.shardsmith-work``), per file: a ``sys.addaudithook``
    hook on "open" events, as bench/sim_meter.py counts them; of them part files (``part-*``); and
    the opens ``release.punch`` made (the spill given back, one open of a part a punch);
  * bytes read: ``/proc/self/io`` rchar for the whole process at exit, and within the unit
    (``run.convert_units``, so imports and the tokenizer are left out); of those, the payload the unit
    gathered (``buckets._load_group`` wrapped: sim_meter.instrument), the rest being metadata (the
    plan's files, pieces, the heads: 24 B a sample);
  * peak resident memory (VmHWM, the whole process) and wall time.
The outputs are checked against a one-process run (`--workers 1`) of the same command: the sha256 of
every file (bench_stages.tree_digest). The targets printed at the end: a gather unit opens each scratch
file at most twice; the part files are O(W) (16 W: ``run.TASKS_PER_RANK`` a rank), not O(corpus); a
unit's peak RSS within --memory + 400 MB; a gather unit's metadata read follows its share (per byte of
its payload, no more at the largest W than at the smallest, within 2x); the bytes equal.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_stages import CLUSTER_ENV, ensure_corpus, ensure_tokenizer, samples_of, scratch_of, tree_digest  # noqa: E402
from harness import clear, ended, run_children, started, verdict, warm  # noqa: E402

STAGES = ("scatter", "plan", "gather", "finalize")
ONCE = ("plan", "finalize")
TASKS_PER_RANK = 16  # shardsmith.engine.shuffle.run.TASKS_PER_RANK (checked in main)
HEADROOM = 400e6  # the target: a unit's peak RSS within --memory + this
CHILD = f"import sys; sys.path.insert(0, {str(HERE)!r}); import bench_exchange; bench_exchange.child(sys.argv[1:])"
TOKENS_PER_BYTE = 0.22  # BPE tokens a byte of the corpus (bench_stages)


# ---------------------------------------------------------------- the meter, in each stage process

def _rchar() -> int:
    with open("/proc/self/io", "rb") as fh:
        return int(dict(line.split(b":") for line in fh.read().splitlines())[b"rchar"])


def _hwm() -> int:
    with open("/proc/self/status", "rb") as fh:
        for line in fh.read().splitlines():
            if line.startswith(b"VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def child(argv: list[str]) -> None:
    """Run ``shardsmith ARGS`` in this process, metered; ``argv``: JSON_OUT SCRATCH ARGS..."""
    import runpy

    out_json, scratch, args = argv[0], Path(argv[1]).resolve(), argv[2:]
    prefix = str(scratch) + os.sep
    per_file: Counter[str] = Counter()
    punching: Counter[str] = Counter()  # the opens of those made by release.punch (giving spill back)
    in_punch = [False]

    def hook(event: str, a: tuple[Any, ...]) -> None:
        if event != "open" or not a or not isinstance(a[0], (str, bytes, os.PathLike)):
            return
        path = os.path.abspath(os.fsdecode(a[0]))
        if path.startswith(prefix):
            per_file[path[len(prefix):]] += 1
            if in_punch[0]:
                punching[path[len(prefix):]] += 1

    from sim_meter import _WATCH, Meter, instrument

    meter = Meter(scratch)  # (its own hook counts the same opens; its phases split the unit's reads)
    sys.addaudithook(hook)
    captured = instrument(meter)  # payload counted where a group is read; phases: read, finish, ...
    from shardsmith.engine.shuffle import release
    from shardsmith.engine.shuffle import run as shuffle_run

    punch = release.punch

    def punched(path: str, ranges: Any, *, fd: int | None = None) -> int:
        in_punch[0] = True
        try:
            return punch(path, ranges, fd=fd)
        finally:
            in_punch[0] = False

    release.punch = punched  # type: ignore[assignment]
    import shutil

    rmtree, removing = shutil.rmtree, [0.0]

    def timed_rmtree(*a: Any, **k: Any) -> Any:  # the scratch folder removed (finalize): its time apart
        t = time.perf_counter()
        try:
            return rmtree(*a, **k)
        finally:
            removing[0] += time.perf_counter() - t

    shutil.rmtree = timed_rmtree  # type: ignore[assignment]
    inner = shuffle_run.convert_units

    def convert_units(*a: Any, **k: Any) -> Any:
        with meter.phase("unit"):
            return inner(*a, **k)

    assert "shardsmith.engine.conduct" not in sys.modules, "conduct imported before convert_units was wrapped"
    shuffle_run.convert_units = convert_units  # type: ignore[assignment]
    sys.argv = ["shardsmith", *args]
    me, real_exit = os.getpid(), os._exit

    def report() -> None:
        parts = {p: n for p, n in per_file.items() if os.path.basename(p).lstrip(".").startswith("part-")}
        unit = {k: 0.0 for k in ("bytes_read", "payload_read")}
        for ph in meter.phases.values():
            for k in unit:
                unit[k] += ph[k]
        reads = per_file - punching
        body = {"opens": sum(per_file.values()), "files": len(per_file), "max_per_file": max(per_file.values(), default=0),
                "max_read_per_file": max(reads.values(), default=0), "punch_opens": sum(punching.values()),
                "part_opens": sum(parts.values()), "part_files": len(parts), "max_per_part": max(parts.values(), default=0),
                "punches": captured.punches, "unit_read": unit["bytes_read"], "payload": _WATCH["payload_read"],
                "meta": unit["bytes_read"] - unit["payload_read"], "rchar": _rchar(), "rss": _hwm(),
                "busiest": per_file.most_common(3), "rmtree_s": removing[0],
                "phases_s": {name: ph["wall"] for name, ph in meter.phases.items()}}
        Path(out_json).write_text(json.dumps(body))

    def exit_(code: int) -> None:  # the CLI leaves with os._exit (cli.py): report first, in this process only
        if os.getpid() == me:
            report()
        real_exit(code)

    os._exit = exit_  # type: ignore[assignment]
    try:
        runpy.run_module("shardsmith", run_name="__main__", alter_sys=True)
    finally:
        report()


# ---------------------------------------------------------------- running the stages

@dataclass
class Unit:
    stage: str
    rank: int
    wall: float
    cpu: float
    m: dict[str, Any]


@dataclass
class Config:
    mb: float
    world: int
    memory: str
    units: list[Unit] = field(default_factory=list)
    parts: int = 0  # part files in the scratch folder after the scatter
    identical: bool | None = None
    mismatch: str = ""
    error: str = ""

    @property
    def label(self) -> str:
        return f"{self.mb / 1000:g} GB, W={self.world}, --memory {self.memory}"

    def of(self, stage: str) -> list[Unit]:
        return [u for u in self.units if u.stage == stage]

    @property
    def wall(self) -> float:
        return sum(u.wall for u in self.units)

    @property
    def critical(self) -> float:
        return sum(max(u.wall for u in self.of(s)) for s in STAGES if self.of(s))


def traces(out: Path) -> list[Path]:
    """What a run leaves beside its output folder: the scratch folder, the lock and its run stamp."""
    lock = out.parent / f".{out.name}.shardsmith-lock"
    return [scratch_of(out), lock, lock.with_name(lock.name + ".run.json")]


def parse_bytes(text: str) -> int:
    units = {"KB": 1e3, "MB": 1e6, "GB": 1e9, "K": 1e3, "M": 1e6, "G": 1e9}
    for suffix, mult in units.items():
        if text.upper().endswith(suffix):
            return int(float(text[: -len(suffix)]) * mult)
    return int(text)


class Bench:
    def __init__(self, args: argparse.Namespace, corpus: Path, tok: Path):
        self.args, self.corpus, self.tok = args, corpus, tok
        size = corpus.stat().st_size
        self.shard_tokens = max(1000, int(size * TOKENS_PER_BYTE / args.shards))
        self.logs = args.workdir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.env = {k: v for k, v in os.environ.items() if k not in CLUSTER_ENV}

    def base(self, out: Path) -> list[str]:
        return ["pack-tokens", str(self.corpus), "--tokenizer", str(self.tok), "--shard-tokens", str(self.shard_tokens),
                "-o", str(out), "--quiet"]

    def metered(self, out: Path, extra: list[str], name: str) -> Unit:
        meter = self.logs / f"{name}.json"
        meter.unlink(missing_ok=True)
        cmd = [sys.executable, "-c", CHILD, str(meter), str(scratch_of(out)), *self.base(out), *extra]
        wall, cpu, _ = run_children([cmd], self.logs / f"{name}.log", env=self.env)
        return Unit("", 0, wall, cpu, json.loads(meter.read_text()))

    def reference(self) -> tuple[Unit, dict[str, str], int]:
        out = self.args.workdir / "exchange-one"
        clear([out, *traces(out)])
        warm([str(self.corpus), str(self.tok)])
        u = self.metered(out, ["--workers", "1"], "one")
        digest, samples = tree_digest(out), samples_of(out)
        clear([out, *traces(out)])
        return u, digest, samples

    def staged(self, world: int, memory: str, ref: dict[str, str] | None) -> Config:
        cfg = Config(self.args.mb, world, memory)
        out = self.args.workdir / f"exchange-w{world}"
        clear([out, *traces(out)])
        warm([str(self.corpus), str(self.tok)])
        try:
            for stage in STAGES:
                if stage == "plan":
                    cfg.parts = len([p for p in scratch_of(out).rglob("part-*") if p.is_file()])
                for rank in range(1 if stage in ONCE else world):
                    u = self.metered(out, ["--workers", "1", "--memory", memory, "--stage", stage, "--rank", str(rank),
                                           "--world-size", str(world)], f"W{world}-{memory}-{stage}-{rank}")
                    u.stage, u.rank = stage, rank
                    cfg.units.append(u)
        except RuntimeError as e:
            cfg.error = str(e).splitlines()[-1][:160]
            clear([out, *traces(out)])
            return cfg
        if ref is not None:
            got = tree_digest(out)
            cfg.identical = got == ref
            if not cfg.identical:
                diff = sorted(k for k in set(got) | set(ref) if got.get(k) != ref.get(k))
                cfg.mismatch = ", ".join(diff[:4]) + (" ..." if len(diff) > 4 else "")
        clear([out, *traces(out)])
        return cfg

    def executor(self, name: str, extra: list[str], ref: dict[str, str] | None) -> dict[str, Any]:
        out = self.args.workdir / f"exchange-{name}"
        clear([out, *traces(out)])
        warm([str(self.corpus), str(self.tok)])
        cmd = [sys.executable, "-m", "shardsmith", *self.base(out), *extra]
        try:
            wall, cpu, _ = run_children([cmd], self.logs / f"{name}.log", env=self.env)
        except RuntimeError as e:
            return {"name": name, "error": str(e).splitlines()[-1][:160]}
        same = tree_digest(out) == ref if ref is not None else None
        clear([out, *traces(out)])
        return {"name": name, "wall": wall, "cpu": cpu, "identical": same}


# ---------------------------------------------------------------- printing

def mb(n: float) -> str:
    return f"{n / 1e6:,.1f}"


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else 0.0


def spread(xs: list[float], fmt: Any = mb) -> str:
    """min / median / max of ``xs``, or the one value."""
    if not xs:
        return "-"
    if len(xs) == 1 or min(xs) == max(xs):
        return fmt(xs[0])
    return f"{fmt(min(xs))} / {fmt(med(xs))} / {fmt(max(xs))}"


def n(x: float) -> str:
    return f"{x:,.0f}"


def report(cfg: Config, memory_bytes: int) -> None:
    print(f"\n{cfg.label}: {cfg.parts} part files (16 x W = {TASKS_PER_RANK * cfg.world}; the engine aims at "
          f"{bound(cfg, {cfg.memory: memory_bytes})})")
    if cfg.error:
        print(f"  failed: {cfg.error}")
        return
    print(f"  {'stage':9s} {'units':>5s} {'opens (scratch)':>19s} {'max a file (read)':>10s} {'parts opened':>17s} "
          f"{'punch opens':>11s} {'meta MB (scatter: input)':>24s} {'payload MB':>20s} {'rchar MB':>20s} {'peak RSS MB':>20s} "
          f"{'wall s':>17s}")
    for stage in STAGES:
        us = cfg.of(stage)
        if not us:
            continue
        g = [u.m for u in us]
        print(f"  {stage:9s} {len(us):5d} {spread([m['opens'] for m in g], n):>19s} "
              f"{max(m['max_per_file'] for m in g):4d} ({max(m['max_read_per_file'] for m in g)}) {spread([m['part_files'] for m in g], n):>17s} "
              f"{spread([m['punch_opens'] for m in g], n):>11s} {spread([m['meta'] for m in g]):>24s} "
              f"{spread([m['payload'] for m in g]):>20s} {spread([m['rchar'] for m in g]):>20s} "
              f"{spread([m['rss'] for m in g]):>20s} {spread([u.wall for u in us], lambda x: f'{x:.1f}'):>17s}")
    tot = lambda k: sum(u.m[k] for u in cfg.units)  # noqa: E731
    meta = sum(u.m["meta"] for u in cfg.units if u.stage != "scatter")  # (a scatter unit's reads are its input)
    print(f"  in all: {tot('opens'):,} opens of the scratch folder ({tot('part_opens'):,} of part files, "
          f"{tot('punch_opens'):,} to punch spill), {mb(meta)} MB of metadata and {mb(tot('payload'))} MB of "
          f"payload read by the units after the scatter, {mb(tot('rchar'))} MB read by the processes; wall {cfg.wall:.1f} s in "
          f"{len(cfg.units)} processes ({cfg.wall / (cfg.mb / 1000):.1f} s/GB), {cfg.critical:.1f} s one "
          f"machine a rank; peak RSS {mb(max(u.m['rss'] for u in cfg.units))} MB "
          f"(--memory {mb(memory_bytes)} MB); output {'identical' if cfg.identical else 'DIFFERS: ' + cfg.mismatch}")


def bound(cfg: Config, memory_of: dict[str, int]) -> int:
    """The part files the engine aims at: 16 a rank, or more where a task would exceed --memory / 8
    (``run.task_size``)."""
    from shardsmith.engine.shuffle.run import task_size

    size = int(cfg.mb * 1e6)
    return max(TASKS_PER_RANK * cfg.world,
               math.ceil(size / task_size(memory=memory_of[cfg.memory], world=cfg.world, input_bytes=size)))


def targets(cfgs: list[Config], memory_of: dict[str, int]) -> list[tuple[str, list[str], bool]]:
    """Each target's cell per configuration and whether it holds in all of them."""
    rows: list[tuple[str, list[str], bool]] = []
    ok_cfgs = [c for c in cfgs if not c.error]

    def row(label: str, cells: list[tuple[bool, str]]) -> None:
        rows.append((label, [("yes " if ok else "NO ") + text for ok, text in cells], all(ok for ok, _ in cells)))

    row("a gather unit opens each scratch file <= 2x",
        [(max(u.m["max_per_file"] for u in c.of("gather")) <= 2,
          f"{max(u.m['max_per_file'] for u in c.of('gather'))}x "
          f"(to read: {max(u.m['max_read_per_file'] for u in c.of('gather'))}x)") for c in ok_cfgs])
    row("part files <= 16 x W (or what --memory / 8 a task makes)",
        [(c.parts <= 1.01 * bound(c, memory_of), f"{c.parts} / {bound(c, memory_of)}") for c in ok_cfgs])
    row("parts a gather unit opens <= the same",
        [(max(u.m["part_files"] for u in c.of("gather")) <= 1.01 * bound(c, memory_of),
          f"{max(u.m['part_files'] for u in c.of('gather'))}") for c in ok_cfgs])
    row("peak RSS <= --memory + 400 MB (any unit)",
        [(max(u.m["rss"] for u in c.units) <= memory_of[c.memory] + HEADROOM,
          f"{mb(max(u.m['rss'] for u in c.units))} MB") for c in ok_cfgs])
    ratios = {}
    for c in ok_cfgs:
        busy = [u for u in c.of("gather") if u.m["payload"] > 0]
        ratios[id(c)] = med([u.m["meta"] / u.m["payload"] for u in busy]) if busy else 0.0
    base = [ratios[id(c)] for c in ok_cfgs if c.memory == ok_cfgs[0].memory and ratios[id(c)] > 0]
    floor = min(base) if base else 0.0
    row("gather metadata / its payload <= 2x the smallest W's",
        [(ratios[id(c)] <= 2 * floor or c.memory != ok_cfgs[0].memory, f"{ratios[id(c)] * 100:.2f} %") for c in ok_cfgs])
    row("output bytes equal the one-process run's", [(bool(c.identical), "same" if c.identical else "differ")
                                                      for c in ok_cfgs])
    return rows


def compact(cfgs: list[Config], memory_of: dict[str, int]) -> None:
    """One line a configuration: the gather units' figures (the most of any), the run's totals."""
    print(f"\n{'':27s} {'':9s}   {'gather unit':-^46s}   {'':8s}   {'in all':-^42s}")
    print(f"{'run':27s} {'parts':>9s}   {'opens/file':>10s} {'parts':>5s} {'punch':>5s} {'meta MB':>7s} {'payl. MB':>8s} "
          f"{'meta':>6s}   {'RSS MB':>6s}   {'opens':>6s} {'payl. MB':>8s} {'wall s':>6s} {'s/GB':>5s} {'rank s':>6s} bytes")
    for c in cfgs:
        if c.error:
            print(f"{c.label:27s} failed: {c.error}")
            continue
        g = [u.m for u in c.of("gather")]
        busy = max(g, key=lambda m: m["payload"])
        print(f"{c.label:27s} {c.parts:>4d}/{bound(c, memory_of):<4d}   "
              f"{max(m['max_per_file'] for m in g):>6d} ({max(m['max_read_per_file'] for m in g)}) "
              f"{max(m['part_files'] for m in g):5d} {max(m['punch_opens'] for m in g):5d} {mb(busy['meta']):>7s} "
              f"{mb(busy['payload']):>8s} {busy['meta'] / max(1, busy['payload']) * 100:5.2f}%   "
              f"{max(u.m['rss'] for u in c.units) / 1e6:6.0f}   {sum(u.m['opens'] for u in c.units):6,d} "
              f"{mb(sum(m['payload'] for m in g)):>8s} {c.wall:6.1f} {c.wall / (c.mb / 1000):5.1f} {c.critical:6.1f} "
              f"{'same' if c.identical else 'DIFFER'}")
    print("gather unit: the most of any gather rank. opens/file: the most opens of one file of the scratch folder\n"
          "(of them, to read); parts: part files opened; punch: opens to give spill back; meta, payl.: the busiest\n"
          "rank's metadata and payload read, meta as a share of payload. RSS: the peak of any unit. In all: opens of\n"
          "the scratch folder, payload read by the gather units, wall of all processes one after another (and per\n"
          "GB), each stage's slowest unit summed (one machine a rank); bytes: against the one-process run's.")


def summary(cfgs: list[Config], memory_of: dict[str, int], memory: str, size_mb: float) -> None:
    """The targets as a table (a column a configuration), then a verdict line each."""
    compact(cfgs, memory_of)
    rows = targets(cfgs, memory_of)
    heads = [f"W={c.world}" + ("" if c.memory == memory else f" {c.memory}") for c in cfgs if not c.error]
    print(f"\ntargets at {size_mb / 1000:g} GB ({', '.join(heads)}):")
    width = max(len(h) for h in heads) + 14
    print(f"  {'target':58s} " + " ".join(f"{h:>{width}s}" for h in heads))
    for label, cells, _ in rows:
        print(f"  {label:58s} " + " ".join(f"{c:>{width}s}" for c in cells))
    for label, _, ok in rows:
        verdict(label, ok, "every configuration" if ok else "not in every configuration")


def print_executors(rows: list[dict[str, Any]]) -> None:
    """The local run (default workers) and the Dask LocalCluster runs: wall, against the local run's."""
    local = next((d["wall"] for d in rows if d["name"] == "local" and "wall" in d), None)
    for d in rows:
        print(f"  {d['name']:8s} " + (d.get("error") or f"{d['wall']:.1f} s wall"
                                      + (f" ({d['wall'] / local:.2f}x the local run's)" if local else "")
                                      + f", {'same bytes' if d['identical'] else 'OTHER BYTES'}"))


def replot(path: Path, args: argparse.Namespace) -> None:
    """A run's tables again from its --json, nothing run."""
    got = json.loads(path.read_text())
    cfgs = [Config(**{**c, "units": [Unit(**u) for u in c["units"]]}) for c in got["configs"]]
    memory_of = {c.memory: parse_bytes(c.memory) for c in cfgs}
    one = got["one"]
    print(f"one process (--workers 1): {one['wall']:.1f} s ({one['wall'] / (got['mb'] / 1000):.1f} s/GB), peak RSS "
          f"{mb(one['m']['rss'])} MB")
    for c in cfgs:
        report(c, memory_of[c.memory])
    summary(cfgs, memory_of, args.memory, got["mb"])
    print_executors(got["dask"])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=1000, help="JSONL corpus size, 10**6 bytes (default 1000)")
    ap.add_argument("--worlds", default="2,8,32,64", help="world sizes W (default 2,8,32,64)")
    ap.add_argument("--memory", default="1GB", help="--memory of every stage (default 1GB, the CLI's)")
    ap.add_argument("--small-memory", default="16MB", help="a second --memory, at --small-at (default 16MB)")
    ap.add_argument("--small-at", type=int, default=8, help="the W of the --small-memory run (0: none; default 8)")
    ap.add_argument("--shards", type=int, default=64, help="shards aimed at (--shard-tokens from it; default 64)")
    ap.add_argument("--dask", default="", help="also `--executor dask --ranks W` for these W, against a local run")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/shardsmith-bench"))
    ap.add_argument("--json", type=Path, help="write every unit's counts here")
    ap.add_argument("--keep-corpus", action="store_true", help="leave the corpus in --workdir (default: removed)")
    ap.add_argument("--replot", type=Path, help="a --json's tables again, nothing run")
    ap.add_argument("--quick", action="store_true", help="smoke run: 3 MB, W=2, no small-memory run")
    args = ap.parse_args(argv)
    if args.replot:
        return replot(args.replot, args)
    if args.quick:
        args.mb, args.worlds, args.small_at, args.shards, args.dask = 3, "2", 0, 4, ""
    from shardsmith.engine.shuffle import run as shuffle_run

    assert shuffle_run.TASKS_PER_RANK == TASKS_PER_RANK, "TASKS_PER_RANK changed in the engine"
    worlds = [int(x) for x in args.worlds.split(",") if x]
    args.workdir = args.workdir.resolve()
    args.workdir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    version = started(f"shardsmith exchange benchmark: {args.mb:g} MB, W in {worlds}")
    corpus = ensure_corpus(args.workdir, args.mb)
    bench = Bench(args, corpus, ensure_tokenizer(args.workdir, corpus))
    print(f"command: shardsmith {' '.join(bench.base(Path('OUT')))} --workers 1 --memory M --stage S --rank R "
          f"--world-size W  (each stage a process, one after another)")
    one, ref, samples = bench.reference()
    print(f"one process (--workers 1): {one.wall:.1f} s ({one.wall / (args.mb / 1000):.1f} s/GB), peak RSS "
          f"{mb(one.m['rss'])} MB, {samples:,} samples, {one.m['part_files']} part files")
    memory_of = {args.memory: parse_bytes(args.memory), args.small_memory: parse_bytes(args.small_memory)}
    cfgs: list[Config] = []
    dask: list[dict[str, Any]] = []

    def save() -> None:  # after every configuration: a long run that stops keeps what it measured
        if args.json:
            args.json.write_text(json.dumps({"mb": args.mb, "shard_tokens": bench.shard_tokens, "one": asdict(one),
                                             "dask": dask, "configs": [asdict(c) for c in cfgs]}, indent=1))

    runs = [(w, args.memory) for w in worlds] + ([(args.small_at, args.small_memory)] if args.small_at else [])
    for world, memory in runs:
        cfgs.append(bench.staged(world, memory, ref))
        report(cfgs[-1], memory_of[memory])
        save()
    summary(cfgs, memory_of, args.memory, args.mb)
    for w in [int(x) for x in args.dask.split(",") if x]:
        if not dask:
            dask.append(bench.executor("local", [], ref))
        dask.append(bench.executor(f"dask-{w}", ["--executor", "dask", "--ranks", str(w)], ref))
    print_executors(dask)
    save()
    if not args.keep_corpus:
        clear([corpus])
    ended(version, t0)


if __name__ == "__main__":
    main()
