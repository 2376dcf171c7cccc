"""Benchmark of the cluster stages (issue 6): scatter + gather + finalize on W simulated ranks against one process.

    python bench/bench_stages.py [--mb 100] [--events 100000] [--repeat 3] [--worlds 1,2,4]
                                 [--workdir /tmp/shardsmith-bench] [--only tokens,tar,events] [--quick]

Three workloads, each run side by side in one go (interleaved repeats, warm page cache):
  * tokens: `pack-tokens` of a synthetic JSONL corpus (bench/corpus.py) with the byte-level BPE of
    bench/make_tokenizers.py, `--shard-tokens` set so that there are about 8 shards;
  * tar: `convert --to webdataset --text-field text` of the same corpus, `--shard-bytes` for ~8 shards;
  * events: `convert --to hdf5` of the IceCube-like ROOT file of bench/bench_events.py (the 7 branches
    it selects), `--shard-samples` for ~8 shards (skipped when the file is absent and --events is 0).
For each: the one-process run with `--workers 1` (the reference) and with the default workers (all
cores, for information); then for every W the staged run: every `--stage scatter --rank R` process,
then `--stage plan`, then every `--stage gather --rank R`, then `--stage finalize`, each its own `shardsmith` process with
`--workers 1`, one after another (simulated ranks on one machine). Its cost is the sum of those
processes' wall times (and of their CPU times); the slowest rank of each stage is what a cluster waits
for. Every staged output tree is checked against the one-process one: the sha256 of every file, and
manifest.json without its `created` and `command` entries.

To tell the fixed cost of a process from the cost of the work, the same command with `--limit 1`
(start-up, imports, tokenizer or schema loading, one record, one shard, the manifest) is timed too:
a staged run of W ranks starts 2W+2 processes where the one-process run starts one.
Wall times include start-up. µs/sample = seconds / samples of the output * 1e6. The shardsmith package
under test is byte-compiled first (harness.byte_compiled), as an installed one is: with
PYTHONDONTWRITEBYTECODE=1 and an editable install, every process would compile its modules from source.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from harness import byte_compiled, clear, code_version, comparable, run_children, verdict, warm  # noqa: E402

TARGET = 1.3  # issue 6: staged cost per sample within 1.3x of one process's
SHARDS = 8  # shards aimed at, so that several gather ranks have a range to write
STAGES = ("scatter", "plan", "gather", "finalize")
ONCE = ("plan", "finalize")  # the stages one process runs (rank 0)
# what bench_events.py selects
BRANCHES = "event_id,azimuth,zenith,pulses_time,pulses_charge,pulses_dom_x,pulses_dom_y"
CLUSTER_ENV = ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", "RANK", "WORLD_SIZE")


# ---------------------------------------------------------------- running and measuring children

@dataclass
class Proc:
    wall: float
    cpu: float
    out: str


def run(cmd: list[str], log: Path) -> Proc:
    """Run `cmd` to completion (stdout kept, stderr to `log`); wall and user+sys CPU; raise on failure.
    The cluster variables of this shell are dropped: the stages get their rank from the options."""
    env = {k: v for k, v in os.environ.items() if k not in CLUSTER_ENV}
    wall, cpu, (out,) = run_children([cmd], log, env=env)
    return Proc(wall, cpu, out)


def tree_digest(folder: Path) -> dict[str, str]:
    """sha256 of every file under `folder` (relative paths), manifest.json and the README.md card
    without what names the run (harness.comparable): what must not depend on how many ranks wrote
    the dataset."""
    digest: dict[str, str] = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        name = str(path.relative_to(folder))
        if name in ("manifest.json", "README.md"):
            digest[name] = hashlib.sha256(comparable(name, path.read_bytes())).hexdigest()
            continue
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while block := f.read(1 << 22):
                h.update(block)
        digest[name] = h.hexdigest()
    return digest


def samples_of(out: Path) -> int:
    manifest = json.loads((out / "manifest.json").read_text())
    return sum(s["samples"] for s in manifest["splits"].values())


def scratch_of(out: Path) -> Path:
    """The scratch folder the stages share, beside the output (shardsmith.engine.shuffle.workdir.work_folder)."""
    return out.parent / f".{out.name}.shardsmith-work"


# ---------------------------------------------------------------- one workload

@dataclass
class Workload:
    name: str
    title: str
    args: list[str]  # the shardsmith command line without -o, --workers, --stage
    inputs: list[Path]  # what to warm before a timed run
    work: Path
    logs: Path

    def cmd(self, out: Path, *extra: str) -> list[str]:
        return [sys.executable, "-m", "shardsmith", *self.args, "-o", str(out), "--quiet", *extra]


@dataclass
class Staged:
    """The processes of one staged run: stage -> the wall and CPU seconds of each rank."""

    walls: dict[str, list[float]] = field(default_factory=dict)
    cpus: dict[str, list[float]] = field(default_factory=dict)

    @property
    def wall(self) -> float:
        return sum(sum(v) for v in self.walls.values())

    @property
    def cpu(self) -> float:
        return sum(sum(v) for v in self.cpus.values())

    def slowest(self, stage: str) -> float:
        return max(self.walls[stage])

    @property
    def critical(self) -> float:
        """The wall time of a cluster with one machine per rank (each stage waits for its slowest rank)."""
        return sum(self.slowest(s) for s in STAGES)


@dataclass
class Results:
    single: dict[str, list[Proc]] = field(default_factory=dict)  # "w1", "default", "limit1"
    staged: dict[int, list[Staged]] = field(default_factory=dict)
    identical: dict[int, bool] = field(default_factory=dict)
    mismatch: dict[int, str] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    samples: int = 0


class Runner:
    def __init__(self, wl: Workload, worlds: list[int]):
        self.wl = wl
        self.worlds = worlds
        self.res = Results()
        self.ref: dict[str, str] | None = None

    def _single(self, key: str, out: Path, *extra: str) -> Proc | None:
        clear([out, scratch_of(out)])
        warm([str(p) for p in self.wl.inputs])
        try:
            p = run(self.wl.cmd(out, *extra), self.wl.logs / f"{self.wl.name}-{key}.log")
        except RuntimeError as e:
            self.res.failed[key] = str(e).splitlines()[-1][:120]
            return None
        self.res.single.setdefault(key, []).append(p)
        return p

    def single(self) -> None:
        out = self.wl.work / f"stages-{self.wl.name}-one"
        if self._single("w1", out, "--workers", "1") and self.ref is None:
            self.ref = tree_digest(out)
            self.res.samples = samples_of(out)
        self._single("default", self.wl.work / f"stages-{self.wl.name}-one-default")

    def fixed(self) -> None:
        self._single("limit1", self.wl.work / f"stages-{self.wl.name}-limit1", "--workers", "1", "--limit", "1")

    def staged(self, world: int) -> None:
        out = self.wl.work / f"stages-{self.wl.name}-w{world}"
        clear([out, scratch_of(out)])
        warm([str(p) for p in self.wl.inputs])
        run_ = Staged()
        try:
            for stage in STAGES:
                for rank in range(world if stage not in ONCE else 1):
                    p = run(self.wl.cmd(out, "--workers", "1", "--stage", stage, "--rank", str(rank),
                                        "--world-size", str(world)),
                            self.wl.logs / f"{self.wl.name}-W{world}-{stage}-{rank}.log")
                    run_.walls.setdefault(stage, []).append(p.wall)
                    run_.cpus.setdefault(stage, []).append(p.cpu)
        except RuntimeError as e:
            self.res.failed[f"W={world}"] = str(e).splitlines()[-1][:120]
            return
        self.res.staged.setdefault(world, []).append(run_)
        if self.ref is not None:
            got = tree_digest(out)
            same = got == self.ref
            self.res.identical[world] = self.res.identical.get(world, True) and same
            if not same:
                diff = sorted(k for k in set(got) | set(self.ref) if got.get(k) != self.ref.get(k))
                self.res.mismatch[world] = ", ".join(diff[:4]) + (" ..." if len(diff) > 4 else "")
        clear([out])  # the staged outputs are only compared; keep the disk free


# ---------------------------------------------------------------- printing

def med(xs: list[float]) -> float:
    return statistics.median(xs)


def report(wl: Workload, r: Results, repeat: int) -> None:
    n = r.samples
    print(f"\n{wl.title}")
    print(f"  command: shardsmith {' '.join(wl.args)} -o OUT --quiet [--workers 1 | --stage S --rank R "
          f"--world-size W --workers 1]; median of {repeat}")
    if not n:
        print(f"  (no reference run: {r.failed.get('w1', '?')})")
        return
    us = 1e6 / n
    ref = med([p.wall for p in r.single["w1"]])
    ref_cpu = med([p.cpu for p in r.single["w1"]])
    print(f"  {'':44s} {'procs':>5s} {'wall s':>7s} {'cpu s':>7s} {'µs/sample':>9s} {'x one':>6s} "
          f"{'slowest rank s: scatter':>23s} {'gather':>7s} {'final':>6s} {'cluster s':>9s}  identical")
    for key, label in (("w1", "one process, --workers 1 (reference)"),
                       ("default", f"one process, default workers ({os.cpu_count()})")):
        if key not in r.single:
            print(f"  {label:44s}  failed: {r.failed.get(key, '?')}")
            continue
        wall, cpu = med([p.wall for p in r.single[key]]), med([p.cpu for p in r.single[key]])
        print(f"  {label:44s} {1:5d} {wall:7.2f} {cpu:7.2f} {wall * us:9.1f} {wall / ref:5.2f}x")
    for world in sorted(set(r.staged) | {int(k[2:]) for k in r.failed if k.startswith("W=")}):
        label = f"staged, W={world} (scatter x{world}, gather x{world}, finalize)"
        runs = r.staged.get(world)
        if not runs:
            print(f"  {label:44s}  failed: {r.failed.get(f'W={world}', '?')}")
            continue
        wall, cpu = med([s.wall for s in runs]), med([s.cpu for s in runs])
        slow = [med([s.slowest(st) for s in runs]) for st in STAGES]
        ok = {True: "yes", False: f"NO ({r.mismatch.get(world, '')})", None: "-"}[r.identical.get(world)]
        print(f"  {label:44s} {2 * world + 2:5d} {wall:7.2f} {cpu:7.2f} {wall * us:9.1f} {wall / ref:5.2f}x "
              f"{slow[0]:23.2f} {slow[1]:7.2f} {slow[2]:6.2f} {med([s.critical for s in runs]):9.2f}  {ok}")
    if "limit1" in r.single:
        fixed = med([p.wall for p in r.single["limit1"]])
        print(f"  fixed cost of one process (same command, --limit 1): {fixed:.2f} s wall, "
              f"{med([p.cpu for p in r.single['limit1']]):.2f} s cpu")
    else:
        fixed = None
    print(f"  {n:,} samples; reference cpu {ref_cpu:.2f} s. 'cluster s': slowest scatter + slowest gather + "
          "finalize, the wall time with one machine per rank")
    if r.staged:
        worst = max(r.staged, key=lambda w: med([s.wall for s in r.staged[w]]))
        wall = med([s.wall for s in r.staged[worst]])
        detail = (f"{wall / ref:.2f}x ({wall * us:.1f} vs {ref * us:.1f} µs/sample; cpu "
                  f"{med([s.cpu for s in r.staged[worst]]) / ref_cpu:.2f}x)")
        if fixed is not None:
            extra_cpu = med([s.cpu for s in r.staged[worst]]) - ref_cpu
            fixed_cpu = med([p.cpu for p in r.single["limit1"]])
            detail += (f"; {wall - ref:.1f} s wall, {extra_cpu:.1f} s cpu more than one process, against "
                       f"{2 * worst + 1} more processes x {fixed_cpu:.2f} s fixed cpu = {(2 * worst + 1) * fixed_cpu:.1f} s")
        verdict(f"issue 6: staged cost within {TARGET}x of one process (W={worst}, {wl.name})",
                wall <= TARGET * ref and all(r.identical.get(w, False) for w in r.staged), detail)
        bad = [w for w in r.staged if not r.identical.get(w, False)]
        if bad:
            print(f"  (output differs from the one-process run for W={bad})")


# ---------------------------------------------------------------- workloads

def ensure_corpus(work: Path, mb: float) -> Path:
    from corpus import write_corpus

    path = work / f"corpus-{mb:g}mb.jsonl"
    if not path.exists():
        tmp = path.with_suffix(".tmp")
        write_corpus(tmp, mb)
        tmp.rename(path)
    return path


def ensure_tokenizer(work: Path, corpus: Path) -> Path:
    tok = work / "tokenizers" / "bpe.json"
    if not tok.exists():
        from make_tokenizers import make_tokenizers

        make_tokenizers(corpus, tok.parent)
    return tok


def ensure_root(work: Path, events: int) -> Path:
    from bench_events import ensure_root as make

    folder = work / "events"
    folder.mkdir(parents=True, exist_ok=True)
    return make(folder, events)[0]


def workloads(args: argparse.Namespace) -> list[Workload]:
    w, logs = args.workdir, args.workdir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    out = []
    if {"tokens", "tar"} & set(args.only):
        corpus = ensure_corpus(w, args.mb)
        size = corpus.stat().st_size
        # ~0.22 BPE tokens per byte of this corpus (bench/corpus.py); ~2.5 B of tar per byte of text
        shard_tokens = max(1000, int(size * 0.22 / SHARDS))
        shard_bytes = max(1 << 16, int(size * 2.5 / SHARDS))
        if "tokens" in args.only:
            tok = ensure_tokenizer(w, corpus)
            out.append(Workload("tokens", f"pack-tokens, byte-level BPE, {size / 1e6:.0f} MB JSONL ({corpus.name})",
                                ["pack-tokens", str(corpus), "--tokenizer", str(tok), "--shard-tokens",
                                 str(shard_tokens)], [corpus, tok], w, logs))
        if "tar" in args.only:
            out.append(Workload("tar", f"convert --to webdataset (text), {size / 1e6:.0f} MB JSONL ({corpus.name})",
                                ["convert", str(corpus), "--to", "webdataset", "--text-field", "text",
                                 "--shard-bytes", str(shard_bytes)], [corpus], w, logs))
    if "events" in args.only and args.events:
        root = ensure_root(w, args.events)
        out.append(Workload("events", f"convert ROOT --to hdf5, {args.events:,} events ({root.name}, "
                            f"{root.stat().st_size / 1e6:.0f} MB)",
                            ["convert", str(root), "--to", "hdf5", "--branches", BRANCHES, "--shard-samples",
                             str(math.ceil(args.events / SHARDS))], [root], w, logs))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # the default size gives each of 4 ranks a few seconds of work: below that, the fixed cost of
    # starting a process (0.5-1.3 s: imports, tokenizer, ROOT schema) is what the ratio measures
    ap.add_argument("--mb", type=float, default=1000, help="JSONL corpus size, 10**6 bytes (default 1000)")
    ap.add_argument("--events", type=int, default=500_000, help="ROOT events (default 500,000; 0 skips)")
    ap.add_argument("--repeat", type=int, default=1, help="runs of every row (medians); default 1")
    ap.add_argument("--worlds", default="2,4", help="simulated world sizes (default 2,4)")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/shardsmith-bench"))
    ap.add_argument("--only", default="tokens,tar,events", help="workloads: tokens,tar,events (default all)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 5 MB corpus, 5,000 events, 1 repeat")
    args = ap.parse_args(argv)
    if args.quick:
        args.mb, args.events, args.repeat = 5, 5000, 1
    args.only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = set(args.only) - {"tokens", "tar", "events"}
    if unknown:
        ap.error(f"--only: unknown workload(s) {', '.join(sorted(unknown))}")
    worlds = [int(x) for x in args.worlds.split(",")]
    args.workdir = args.workdir.resolve()
    args.workdir.mkdir(parents=True, exist_ok=True)

    t_start = time.perf_counter()
    print(f"shardsmith stages benchmark: W in {worlds}, {os.cpu_count()} cores, workdir {args.workdir}, "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    version = code_version()
    print(f"shardsmith under test: {version}; byte-compiled {byte_compiled()}")
    for wl in workloads(args):
        runner = Runner(wl, worlds)
        for _ in range(args.repeat):  # interleaved, so that drift on a shared machine hits every row alike
            runner.fixed()
            runner.single()
            for world in worlds:
                runner.staged(world)
        report(wl, runner.res, args.repeat)
        clear([wl.work / f"stages-{wl.name}-{k}" for k in ("one", "one-default", "limit1")])  # free the disk
    if code_version() != version:
        print(f"\nWARNING: the code changed during the run ({version} -> {code_version()}): rows mix versions")
    print(f"\ntotal {time.perf_counter() - t_start:.0f} s; load average at the end: "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} (1, 5, 15 min; anything else running on this "
          "machine skews the figures)")


if __name__ == "__main__":
    main()
