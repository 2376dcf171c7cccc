"""The scaling curve (issues 18, 31): `pack-tokens`, `convert --to hdf5` and `convert --to webdataset`
at growing input sizes, so a user sees that the cost grows linearly with the input and memory stays flat.

    python bench/bench_scaling.py [--sizes 0.1,1,10] [--workdir /tmp/shardsmith-bench/scaling] [--repeat 1]
    python bench/bench_scaling.py --sizes 0.02,0.05,0.1          # a quick check (~1-2 min)
    python bench/bench_scaling.py --sizes 1,10 --only events     # one command: events, images or tokens
    python bench/bench_scaling.py --sizes 0.3 --only tokens --tokens-workers 1 --shard-tokens 8M  # the spill's release

Inputs, generated once per size and reused from --workdir (each written under a temporary name, in
pieces, in a child process whose own peak memory is printed: the generators never hold GBs):
  * tokens: the `bench/corpus.py` JSONL (size GB of it), tokenized by `pack-tokens --workers 2` with a
    32k byte-level BPE trained once on the first 4 MB of the smallest corpus (`make_tokenizers.train_bpe`;
    gigatoken is the engine shardsmith picks for it);
  * images: an ImageFolder of bench/images.py's JPEGs (~27 KB each, 100 classes; 512 encoded once and
    copied, each copy made unique by a JPEG comment segment: `make_images`), converted by
    `convert --to webdataset --workers 2` (the copy path: no shuffle spill);
  * events: an IceCube-like ROOT file (`shardsmith.demo.root_files.make_icecube_like`, ~240 pulses an
    event, seed 0, baskets of 10k events) of about size GB, converted by `convert --to hdf5 --workers 2`
    with bench_events.py's 7 branches.
Size is the input file's bytes (GB = 10**9 B); MB/s is input MB per wall second. Each run is a child
`python -m shardsmith ...`; its wall time includes start-up. Before a run the input is read once (warm
page cache) when it fits in half the available memory; larger inputs are read cold (the "cache" column).
Peak RSS is the largest sum of VmRSS over the child and all its descendants, read from /proc every 50 ms
(no psutil here): a page shared by processes (libraries, file mappings, the pages forked workers
inherit) counts in each, so the sum overstates; peak PSS, read in the same walk, counts each page
once (what a batch system's memory limit sees is closer to it). Both commands keep the shuffle
within --memory (default 1GB; --memory passes one to both), so peak memory grows with the input only
until the budget (or a read step) is full, then stays flat. Peak disk: the largest size of the output folder and its spill folder beside it
(allocated blocks: punched holes do not count), every 5 ms, or every 20 walks' time where the folders
hold many files (a walk every 5 ms of a 10 GB run's ~400 part files took a core from the run).
"x s/GB" is the time per GB over the smallest size's (1.0 everywhere: linear; start-up inflates the
smallest); the fit line, wall = fixed + s/GB x size, separates start-up from the per-GB cost.

Prints the load average at start and end and the commit under test; writes scaling.png (time vs size,
log-log, and peak memory vs size) and scaling.json (every figure) to --workdir. Before generating it
checks the free space for the missing inputs plus the largest run's outputs and refuses if short.

Expected time of the default run (0.1, 1, 10 GB: 11.1 GB of each input) on an idle 2-core machine:
generating the inputs ~15 min, once (corpus 25-50 MB/s, ROOT 13-24 MB/s, images ~150 MB/s); the runs
~3 min (10 GB: pack-tokens ~65 s, events ~70 s, images ~15 s). Disk: 33 GB of inputs plus, while the
10 GB events conversion runs, ~16 GB of spill and output (1.6x its input with the spill given back as
the gather goes; the check asks for 2x). bench/README.md has the figures; docs/img/scaling.png the plot.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from harness import code_version, key_figure, tree_memory_kb, warm  # noqa: E402

WORKERS = 2
TOKENS_OPTIONS: dict[str, str] = {}  # pack-tokens' --workers / --shard-tokens (the spill release's checks, issue 31)
ROOT_BYTES_PER_EVENT = 2579  # make_icecube_like at 240 pulses, seed 0: a 20k-event file is 51.6 MB
TOKENIZER_SAMPLE_MB = 4
# RSS every 50 ms; the output folders' size every 5 ms on a thread of its own (the peak lasts from the
# gather's last shard to the spill's removal: at small sizes, less than a tenth of a second), or less
# often where a walk of the folders takes long (``measure``)
SAMPLE_S, DISK_S = 0.05, 0.005


# ---------------------------------------------------------------- inputs (each made in a child process)

def make_corpus(path: Path, size_bytes: int) -> None:
    from corpus import write_corpus

    write_corpus(path, size_bytes / 1e6)


def make_events(path: Path, size_bytes: int) -> None:
    from bench_events import MEAN_PULSES, SEED

    from shardsmith.demo.root_files import make_icecube_like

    make_icecube_like(path, events=max(1000, round(size_bytes / ROOT_BYTES_PER_EVENT)),
                      mean_pulses=MEAN_PULSES, seed=SEED)


def make_tokenizer(path: Path, corpus: Path) -> None:
    from make_tokenizers import sample_texts, train_bpe

    train_bpe(list(sample_texts(corpus, TOKENIZER_SAMPLE_MB))).save(str(path))


IMAGE_POOL, IMAGE_CLASSES = 512, 100


def make_images(path: Path, size_bytes: int) -> None:
    """An ImageFolder of about ``size_bytes``: bench/images.py's JPEGs (~27 KB, ImageNet-like), a pool of
    512 encoded once and written again and again, each copy made unique by a comment segment (JPEG COM)
    after its start marker: distinct files (no hard links, no page-cache sharing), decodable as they are,
    at the disk's speed rather than the encoder's (370k images for 10 GB)."""
    from images import class_names, make_image

    pool: list[bytes] = []  # encoded as first needed (a small folder needs fewer than the 512)
    classes = class_names(IMAGE_CLASSES)
    for name in classes:
        (path / name).mkdir(parents=True, exist_ok=True)
    written = i = 0
    while written < size_bytes:
        if i < IMAGE_POOL:
            pool.append(make_image(0, i))
        jpeg, name = pool[i % IMAGE_POOL], classes[i % IMAGE_CLASSES]
        note = b"shardsmith bench copy %d" % i
        data = jpeg[:2] + b"\xff\xfe" + (len(note) + 2).to_bytes(2, "big") + note + jpeg[2:]
        (path / name / f"{name}_{i:07d}.jpg").write_bytes(data)
        written += len(data)
        i += 1


MAKERS: dict[str, Callable[[Path, int], None]] = {"corpus": make_corpus, "events": make_events,
                                                  "images": make_images}


@dataclass(frozen=True, kw_only=True)
class Workload:
    """One command measured at every size: how its input is made and named, how it is run."""

    name: str
    maker: str  # a key of MAKERS
    suffix: str
    disk_factor: float  # free space a run needs beside its input, in inputs (measured at 10 GB: 0.86, 1.6, 1.07)
    command: Callable[[Path, Path, Path], list[str]]  # (input, output, tokenizer) -> argv after -m shardsmith


def _pack_tokens(src: Path, out: Path, tokenizer: Path) -> list[str]:
    options = {"--workers": str(WORKERS), **TOKENS_OPTIONS}
    return ["pack-tokens", str(src), "-o", str(out), "--tokenizer", str(tokenizer),
            *(x for kv in options.items() for x in kv)]


def _convert_hdf5(src: Path, out: Path, tokenizer: Path) -> list[str]:
    from bench_events import PULSES, SCALARS

    return ["convert", str(src), "-o", str(out), "--to", "hdf5", "--branches", ",".join((*SCALARS, *PULSES)),
            "--workers", str(WORKERS)]


def _convert_images(src: Path, out: Path, tokenizer: Path) -> list[str]:
    return ["convert", str(src), "-o", str(out), "--to", "webdataset", "--workers", str(WORKERS)]


WORKLOADS = (
    Workload(name="pack-tokens", maker="corpus", suffix="jsonl", disk_factor=1.5, command=_pack_tokens),
    Workload(name="convert --to hdf5", maker="events", suffix="root", disk_factor=2.0, command=_convert_hdf5),
    Workload(name="convert --to webdataset", maker="images", suffix="", disk_factor=1.2, command=_convert_images),
)
ONLY = {"tokens": WORKLOADS[:1], "events": WORKLOADS[1:2], "images": WORKLOADS[2:]}  # --only


def input_path(work: Path, load: Workload, gb: float) -> Path:
    """A file, or a folder (images) when the workload has no suffix."""
    return work / f"{load.maker}-{gb:g}gb{'.' + load.suffix if load.suffix else ''}"


def input_bytes(path: Path) -> int:
    """The input's size: a file's, or the files' under a folder."""
    if path.is_file():
        return path.stat().st_size
    return sum(os.stat(os.path.join(d, f)).st_size for d, _, files in os.walk(path) for f in files)


# ---------------------------------------------------------------- running a child and sampling its tree


def folder_bytes(path: Path) -> int:
    """Bytes allocated under `path` (files vanish while a run renames and removes its spill)."""
    total = 0
    for folder, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(FileNotFoundError):  # renamed or removed since the listing
                total += os.stat(os.path.join(folder, f)).st_blocks * 512
    return total


@dataclass
class Measure:
    wall: float
    peak_rss_mb: float
    peak_disk_mb: float
    peak_pss_mb: float = 0.0
    final_disk_mb: float = 0.0  # what is left once the run ends: the output (its spill folder removed)


def measure(cmd: list[str], log: Path, out: Path | None = None) -> Measure:
    """Run `cmd` to completion, sampling its process tree's RSS and the size of folder `out`; raise
    on failure."""
    with open(log, "wb") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
        rss, pss, disk, done = [0], [0], [0], threading.Event()

        def sample() -> None:
            pause = SAMPLE_S
            while not done.wait(pause):
                t = time.perf_counter()
                now_rss, now_pss = tree_memory_kb(proc.pid, keys=("VmRSS:", "Pss:"))
                rss[0], pss[0] = max(rss[0], now_rss), max(pss[0], now_pss)
                # PSS walks every mapping of every process (the gather maps GBs of spill), holding
                # each one's memory map lock: at most 5 % of the time, as the disk sampler
                pause = max(SAMPLE_S, 20 * (time.perf_counter() - t))

        def sample_disk() -> None:
            pause = DISK_S
            while out is not None and not done.wait(pause):
                t = time.perf_counter()
                disk[0] = max(disk[0], folder_bytes(out))
                # a walk of hundreds of part files takes ms: wait 20 times as long, so the sampling
                # takes at most 5 % of a core from the run it measures (2 cores here)
                pause = max(DISK_S, 20 * (time.perf_counter() - t))

        samplers = [threading.Thread(target=sample, daemon=True), threading.Thread(target=sample_disk, daemon=True)]
        for t in samplers:
            t.start()
        code = proc.wait()
        wall = time.perf_counter() - t0
        done.set()
        for t in samplers:
            t.join()
    if code != 0:
        tail = log.read_text(errors="replace")[-2000:]
        raise RuntimeError(f"{' '.join(cmd)} exited {code}; stderr tail:\n{tail}")
    final = folder_bytes(out) if out is not None else 0
    disk[0] = max(disk[0], final)
    return Measure(wall, rss[0] / 1024, disk[0] / 1e6, pss[0] / 1024, final / 1e6)


def ensure_input(work: Path, load: Workload, gb: float) -> Path:
    path = input_path(work, load, gb)
    if not path.exists():
        tmp = path.with_name(path.name + ".tmp")
        m = measure([sys.executable, __file__, "--make", load.maker, str(int(gb * 1e9)), str(tmp)],
                    work / "logs" / f"make-{path.name}.log")
        os.replace(tmp, path)
        size = input_bytes(path)
        print(f"  generated {path.name}: {size / 1e6:,.0f} MB in {m.wall:.1f} s "
              f"({size / 1e6 / m.wall:.0f} MB/s), generator peak RSS {m.peak_rss_mb:,.0f} MB")
    return path


def check_disk(work: Path, sizes: list[float], loads: tuple[Workload, ...] = WORKLOADS) -> str | None:
    """A one-line refusal if the missing inputs plus the largest run's outputs do not fit in `work`."""
    missing = sum(gb for load in loads for gb in sizes if not input_path(work, load, gb).exists())
    outputs = max(gb * load.disk_factor for load in loads for gb in sizes)
    need, free = missing + outputs + 0.5, shutil.disk_usage(work).free / 1e9
    if need > free:
        return (f"bench_scaling: needs ~{need:.1f} GB free in {work} ({missing:.1f} GB of inputs to "
                f"generate, {outputs:.1f} GB for the largest run's output and spill), has {free:.1f} GB; "
                f"use smaller --sizes or another --workdir")
    return None


# ---------------------------------------------------------------- the run

@dataclass
class Point:
    workload: str
    size_gb: float
    input_bytes: int
    cache: str
    walls: list[float] = field(default_factory=list)
    peak_rss_mb: float = 0.0
    peak_disk_mb: float = 0.0
    peak_pss_mb: float = 0.0
    output_mb: float = 0.0

    @property
    def wall(self) -> float:
        return statistics.median(self.walls)

    @property
    def s_per_gb(self) -> float:
        return self.wall / (self.input_bytes / 1e9)


def run_point(point: Point, load: Workload, src: Path, work: Path, tokenizer: Path,
              memory: str | None) -> None:
    scratch = work / "run"  # the output and, beside it, the run's spill folder (.out.shardsmith-work)
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir()
    out = scratch / "out"
    if point.cache == "warm":
        warm([str(src)])
    cmd = [sys.executable, "-m", "shardsmith", *load.command(src, out, tokenizer), "--quiet",
           *(["--memory", memory] if memory else [])]
    m = measure(cmd, work / "logs" / f"{load.name.split()[0]}-{point.size_gb:g}gb.log", scratch)
    shutil.rmtree(scratch, ignore_errors=True)
    point.walls.append(m.wall)
    point.peak_rss_mb = max(point.peak_rss_mb, m.peak_rss_mb)
    point.peak_disk_mb = max(point.peak_disk_mb, m.peak_disk_mb)
    point.peak_pss_mb = max(point.peak_pss_mb, m.peak_pss_mb)
    point.output_mb = m.final_disk_mb


def linear_fit(points: list[Point]) -> tuple[float, float] | None:
    """Least-squares wall = fixed + per_gb * GB over the sizes (None with fewer than 2 sizes)."""
    if len(points) < 2:
        return None
    import numpy as np

    per_gb, fixed = np.polyfit([p.input_bytes / 1e9 for p in points], [p.wall for p in points], 1)
    return float(fixed), float(per_gb)


def print_table(name: str, points: list[Point]) -> None:
    ref = points[0]
    options = " ".join(f"{k} {v}" for k, v in {"--workers": WORKERS, **(TOKENS_OPTIONS if name == "pack-tokens"
                                                                     else {})}.items())
    print(f"\n{name} ({options}), {len(ref.walls)} run(s) each, median wall")
    print(f"  {'size GB':>8s} {'wall s':>8s} {'MB/s':>7s} {'peak RSS MB':>12s} {'peak PSS MB':>12s} "
          f"{'x s/GB':>7s} {'peak disk MB':>13s} {'output MB':>10s}  cache")
    for p in points:
        print(f"  {p.input_bytes / 1e9:8.3f} {p.wall:8.2f} {p.input_bytes / 1e6 / p.wall:7.1f} "
              f"{p.peak_rss_mb:12,.0f} {p.peak_pss_mb:12,.0f} {p.s_per_gb / ref.s_per_gb:7.2f} "
              f"{p.peak_disk_mb:13,.0f} {p.output_mb:10,.0f}  {p.cache}")
    print("  RSS: summed over the process tree (a page forked workers share counts in each); PSS: each page once;\n"
          "  peak disk: the output and its spill folder (not the input); output: what is left at the end")
    if fit := linear_fit(points):
        fixed, per_gb = fit
        marginal = f", marginal {1000 / per_gb:.0f} MB/s" if per_gb > 0 else ""
        print(f"  linear fit: wall = {fixed:.2f} s + {per_gb:.1f} s/GB x size "
              f"(fixed: start-up, imports{marginal})")
    big = points[-1]
    key_figure(name, f"s/GB at {big.input_bytes / 1e9:.2g} GB = {big.s_per_gb / ref.s_per_gb:.2f}x that at "
               f"{ref.input_bytes / 1e9:.2g} GB (<= 1: linear or better); peak PSS {ref.peak_pss_mb:,.0f} -> "
               f"{big.peak_pss_mb:,.0f} MB")


def plot(points: dict[str, list[Point]], path: Path, subtitle: str) -> None:
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4.5))
    for name, pts in points.items():
        gb = [p.input_bytes / 1e9 for p in pts]
        line, = ax_t.loglog(gb, [p.wall for p in pts], "o-", label=name)
        fit = linear_fit(pts)
        if fit and all(fit[0] + fit[1] * g > 0 for g in gb):  # a log axis cannot draw a fit below zero
            ax_t.loglog(gb, [fit[0] + fit[1] * g for g in gb], ":", color=line.get_color(),
                        label=f"{name}: fit {fit[0]:.2f} s + {fit[1]:.1f} s/GB")
        ax_m.semilogx(gb, [p.peak_pss_mb for p in pts], "o-", color=line.get_color(), label=f"{name}: PSS")
        ax_m.semilogx(gb, [p.peak_rss_mb for p in pts], "x--", color=line.get_color(), label=f"{name}: RSS summed")
    ax_t.set(title="Wall time vs input size", xlabel="input size (GB, log)", ylabel="wall time (s, log)")
    ax_m.set(title="Peak memory of the process tree vs input size", xlabel="input size (GB, log)",
             ylabel="peak memory of the process tree (MB)")
    ax_m.set_ylim(bottom=0)
    plain = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")
    sizes = sorted({float(f"{p.input_bytes / 1e9:.2g}") for pts in points.values() for p in pts})
    for ax in (ax_t, ax_m):
        ax.set_xticks(sizes)  # one labelled tick per measured size
        ax.xaxis.set_major_formatter(plain)
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.yaxis.set_major_formatter(plain)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    # minor ticks labelled at 2 and 5 of each decade only (all of them overlap near the top of a decade)
    ax_t.yaxis.set_minor_formatter(matplotlib.ticker.FuncFormatter(
        lambda v, _: f"{v:g}" if v > 0 and f"{v:.0e}"[0] in "25" else ""))
    fig.suptitle(f"shardsmith scaling ({subtitle})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def sizes_gb(text: str) -> list[float]:
    """--sizes: positive GB figures, sorted (argparse turns the ValueError into a one-line error)."""
    sizes = sorted({float(s) for s in text.split(",")})
    if sizes[0] <= 0:
        raise ValueError(text)
    return sizes


def loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=sizes_gb, default="0.1,1,10",
                    help="input sizes in GB (10**9 B), comma-separated; default 0.1,1,10")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/shardsmith-bench/scaling"))
    ap.add_argument("--repeat", type=int, default=1,
                    help="runs per size (median wall, max memory); default 1")
    ap.add_argument("--memory", help="--memory passed to both commands (default: theirs, 1GB)")
    ap.add_argument("--only", choices=sorted(ONLY), help="one command: events (convert --to hdf5), images "
                    "(convert --to webdataset) or tokens (pack-tokens); default all three")
    ap.add_argument("--tokens-workers", type=int, help="pack-tokens' --workers (default 2)")
    ap.add_argument("--shard-tokens", help="pack-tokens' --shard-tokens (default: its own, 1G): smaller shards "
                    "show the spill given back at small sizes")
    ap.add_argument("--make", nargs=3, help=argparse.SUPPRESS)  # child: KIND BYTES PATH
    args = ap.parse_args(argv)
    if args.make:
        MAKERS[args.make[0]](Path(args.make[2]), int(args.make[1]))
        return
    sizes = args.sizes
    if args.tokens_workers is not None:
        TOKENS_OPTIONS["--workers"] = str(args.tokens_workers)
    if args.shard_tokens:
        TOKENS_OPTIONS["--shard-tokens"] = args.shard_tokens
    work = args.workdir.resolve()
    (work / "logs").mkdir(parents=True, exist_ok=True)
    loads = ONLY[args.only] if args.only else WORKLOADS
    if refusal := check_disk(work, sizes, loads):
        raise SystemExit(refusal)
    version, start = code_version(), loadavg()
    print(f"shardsmith scaling benchmark: sizes {', '.join(f'{s:g}' for s in sizes)} GB, "
          f"{os.cpu_count()} cores, workdir {work}")
    print(f"load average at start: {start} (1, 5, 15 min)\nshardsmith under test: {version}")
    avail = int(next(ln.split()[1] for ln in Path("/proc/meminfo").read_text().splitlines()
                     if ln.startswith("MemAvailable:"))) * 1024
    points: dict[str, list[Point]] = {}
    for load in loads:
        points[load.name] = []
        for gb in sizes:
            src = ensure_input(work, load, gb)
            size = input_bytes(src)
            points[load.name].append(Point(load.name, gb, size, "warm" if size < avail / 2 else "cold"))
    tokenizer = work / "bpe.json"
    if WORKLOADS[0] in loads and not tokenizer.exists():
        make_tokenizer(tokenizer, input_path(work, WORKLOADS[0], sizes[0]))
    for _ in range(args.repeat):
        for load in loads:
            for p in points[load.name]:
                run_point(p, load, input_path(work, load, p.size_gb), work, tokenizer, args.memory)
    for name, pts in points.items():
        print_table(name, pts)
    end = loadavg()
    subtitle = (f"{version.split(',')[0]}, {os.cpu_count()} cores, load average {start.split()[0]} at start, "
                f"{end.split()[0]} at end")
    plot(points, work / "scaling.png", subtitle)
    figures = {"version": version, "cores": os.cpu_count(), "memory": args.memory or "default",
               "load_start": start, "load_end": end,
               "points": [{**asdict(p), "wall": p.wall, "s_per_gb": p.s_per_gb}
                          for pts in points.values() for p in pts],
               "linear_fit_fixed_s_per_gb_s": {name: linear_fit(pts) for name, pts in points.items()}}
    (work / "scaling.json").write_text(json.dumps(figures, indent=1) + "\n")
    print(f"\nplot {work / 'scaling.png'}, figures {work / 'scaling.json'}")
    if code_version() != version:
        print(f"WARNING: the code changed during the run ({version} -> {code_version()}): rows mix versions")
    print(f"load average at the end: {end} (1, 5, 15 min; other work on this machine skews the figures)")


if __name__ == "__main__":
    main()
