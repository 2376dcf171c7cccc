"""`make bench`: every benchmark of bench/ that can run on this machine, at quick sizes, one after another.

    python bench/suite.py [--only mix,pack_tokens] [--out build/bench] [--list]
    make bench [BENCH=mix,pack_tokens]

Each benchmark runs as its own process with its work folder and tempfile's folder under ``--out`` (never
/tmp), its whole output in ``OUT/NAME.log``; its rows as it ends (status, wall time, its PASS/FAIL
verdicts and headline figures: harness.verdict, harness.key_figure) and the table again at the end, with
the peer tools ("anchors") and modules that are missing here and the command that installs them. A
benchmark that lacks a module it needs, or a GPU, is skipped with the reason. The sizes are small (about
ten minutes in all on 2 busy cores): the figures of record come from the full-size runs that
bench/README.md gives, on an idle machine.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from harness import KEY, anchor_python  # noqa: E402

ANCHOR_SETUP = "bash bench/anchors/setup.sh"  # its own venv: these tools pin versions the project's venv cannot take
DEV = "pip install -e '.[dev]'"
# the one place that says how to install each module a benchmark needs or compares with
INSTALL = {"datatrove": ANCHOR_SETUP, "streaming": ANCHOR_SETUP, "litdata": ANCHOR_SETUP,
           "megatron.core": DEV, "torch": DEV, "torchdata": DEV, "transformers": DEV, "wids": DEV,
           "uproot": "pip install -e '.[root]'", "awkward": "pip install -e '.[root]'",
           "PIL": "pip install -e '.[images]'", "simplejpeg": "pip install -e '.[images]'",
           "webdataset": "pip install -e '.[webdataset]'", "matplotlib": "pip install -e '.[report]'",
           "distributed": "pip install -e '.[dask]'", "ray": "pip install -e '.[ray]'",
           "datasketch": "pip install datasketch", "xxhash": "pip install xxhash", "moto": DEV, "boto3": DEV,
           "s3fs": "pip install -e '.[s3]'", "lance": "pip install -e '.[lance]'",
           # the release built for the dev extra's torch==2.13.0 (a later one would replace torch)
           "torchvision": "pip install torchvision==0.28.0"}
# the venv's scripts first, as in an activated venv (bench/stream_loader.py starts moto_server from PATH)
PATH = os.pathsep.join((str(Path(sys.executable).parent), os.environ.get("PATH", "")))
MARKS = ("  PASS  ", "  FAIL  ", KEY)  # the lines of a benchmark's log that the table shows


def install(module: str) -> str:
    """The command that installs ``module`` for the benchmarks."""
    return INSTALL.get(module, f"pip install {module}")


@dataclass(frozen=True)
class Bench:
    """One benchmark: ``bench/bench_{name}.py`` and how the suite runs it."""

    name: str
    args: tuple[str, ...]          # a quick run's options
    work: str | None = "--workdir"  # the option that takes its work folder (None: it writes nothing)
    needs: tuple[str, ...] = ()    # modules this interpreter must have, or it is skipped (tests check its imports)
    anchors: tuple[str, ...] = ()  # peer tools it compares with, when installed (else its rows say "not installed")
    unless: str = ""               # "cuda": runs only where torch sees a GPU
    note: str = ""                 # what the quick run leaves out of the full one
    file: str = ""                 # its script when not bench_{name}.py

    @property
    def script(self) -> Path:
        return HERE / (self.file or f"bench_{self.name}.py")


SUITE = (
    Bench("pack_tokens", ("--mb", "10", "--repeat", "1"), needs=("torch", "awkward"),
          anchors=("datatrove", "megatron.core")),
    Bench("convert", ("--n", "400", "--aug-n", "100", "--repeat", "1"), needs=("PIL", "simplejpeg", "webdataset", "wids"),
          anchors=("streaming", "litdata")),
    Bench("copy_listing", ("--files", "3000"), work="--tmp",
          note="this checkout alone (at full size: 100k and 1M files beside 8ac82ac, --old)"),
    Bench("tar_loader", ("--samples", "2000", "--repeat", "1"), work=None, needs=("webdataset",), anchors=("wids",)),
    Bench("events", ("--events", "20000", "--gzip-events", "5000", "--seconds", "0.3", "--repeat", "1"),
          needs=("uproot", "awkward")),
    Bench("memmap", ("--events", "20000", "--repeat", "1"), needs=("uproot", "awkward")),
    Bench("parquet_out", ("--mb", "10", "--repeat", "1")),
    Bench("mds_out", ("--rows", "20000", "--repeat", "1"), needs=("streaming",)),
    Bench("lance_out", ("--mb", "10", "--images", "200", "--repeat", "1"), needs=("lance", "PIL", "simplejpeg")),
    Bench("pack", ("--mb", "5", "--repeat", "1")),
    Bench("chat", ("--conversations", "300", "--seq-lens", "2048"), work="--out", needs=("torch", "transformers")),
    Bench("mix", ("--samples", "200000", "--windows", "20000", "--repeat", "1"), work=None,
          needs=("torch", "torchdata", "megatron.core")),
    Bench("resume", ("--samples", "100000", "--repeat", "1"), work=None, needs=("torch", "torchdata")),
    Bench("augment", ("--images", "50", "--rounds", "1"), work=None, needs=("PIL", "simplejpeg")),
    Bench("crash_safety", ("--repeat", "1"), needs=("PIL",)),
    Bench("dedup", ("--mb", "5", "--sample-mb", "2", "--only", "shardsmith,cost,decon"),
          note="no datatrove row (at full size, from its own venv: bench/README.md, 'Dedup and decontamination')"),
    Bench("minhash_core", ("--mb", "2", "--pairs", "200"), work=None, needs=("xxhash",)),
    Bench("minhash_libs", ("--mb", "2", "--pairs", "200", "--num-perm", "128"), work=None, needs=("xxhash",),
          anchors=("datasketch",)),
    Bench("stages", ("--quick", "--mb", "20", "--events", "20000", "--worlds", "2")),
    Bench("exchange", ("--quick",), note="3 MB on W = 2 (at full size: 1 GB on W = 2, 8, 32, 64 and at --memory 16MB)"),
    Bench("scaling", ("--sizes", "0.005,0.02"), needs=("matplotlib",)),
    Bench("sim_exchange", ("--quick",), file="sim_exchange.py",
          note="toy sizes (at full size: measured to 100 GB / 100 ranks, fitted to 100 TB / 4,000)"),
    Bench("executors", ("--mb", "10", "--ranks", "2", "--executors", "local,dask", "--only", "tokens"),
          needs=("distributed",), anchors=("ray",),
          note="no Ray rows (at full size: --executors local,dask,ray starts a Ray head here)"),
    Bench("s3_inputs", ("--mb", "5", "--images", "200", "--repeat", "1"), work="--work", file="s3_inputs.py",
          needs=("moto", "boto3", "s3fs")),
    Bench("s3_outputs", ("--mb", "5", "--shard-bytes", "1MB", "--shard-tokens", "256K"), file="s3_outputs.py",
          needs=("moto", "boto3", "s3fs")),
    Bench("stream_loader", ("--mb", "5", "--shard-bytes", "500KB", "--random", "100"), work=None, file="stream_loader.py",
          needs=("moto", "boto3", "s3fs", "torch"), anchors=("webdataset",)),
    Bench("gpu_feed", ("--images", "2000", "--steps", "20"), needs=("torch", "PIL", "simplejpeg"),
          anchors=("torchvision",), unless="cuda", note="no DALI row (its wheel is too big to carry to the device)"),
)
BY_NAME = {b.name: b for b in SUITE}
# the other scripts of bench/, and why the suite does not run them
NOT_RUN = {"ab_versions": "two checkouts side by side (--base PATH)",
           "ab_loader": "two checkouts' loaders side by side (--base PATH)",
           "ab_memmap": "two checkouts' convert --to memmap side by side (--base PATH)",
           "campaign_signals": "a count of outcomes under signals, not a measure of speed",
           "campaign_storage": "a count of outcomes under kills and races, not a measure of speed",
           "campaign_inputs": "a count of outcomes of crafted templates and endless inputs, not a measure of speed",
           "campaign_crafted": "a count of outcomes of crafted sidecars, states and manifests, not a measure of speed",
           "profile_events": "profiles one command that you give it",
           "dedup_floor": "a floor measured on a corpus file that you give it",
           "dedup_datatrove": "datatrove's side of bench_dedup, run from its venv",
           **dict.fromkeys(("harness", "corpus", "images", "chat_data", "planted", "make_tokenizers", "suite",
                            "sim_json", "sim_meter", "sim_today", "sim_workload"), "a helper of the benchmarks"),
           "sim_check": "the self-check of sim_exchange (which runs it first)"}


def has(module: str) -> bool:
    """Whether this interpreter can import ``module`` (a dotted name whose parent is missing: no)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def why_not(bench: Bench) -> str:
    """Why a benchmark cannot run here ("" when it can), with the commands that install what it lacks."""
    missing = [m for m in bench.needs if not has(m)]
    if missing:
        return "needs " + "; ".join(f"{m} ({install(m)})" for m in missing)
    if bench.unless == "cuda":
        import torch

        if not torch.cuda.is_available():
            return "needs a CUDA GPU (bench/README.md, 'a fed GPU', runs it on a device machine)"
    return ""


def missing_anchors(bench: Bench) -> list[str]:
    """The peer tools ``bench`` compares with that neither bench/.venv-anchors nor this venv has."""
    return [m for m in bench.anchors if anchor_python(m) is None]


def choose(only: str) -> list[Bench]:
    """The benchmarks ``BENCH=`` names (all when empty); an unknown name is one line and exit 2."""
    names = [n.strip().removeprefix("bench_").removesuffix(".py") for n in only.split(",") if n.strip()]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        print(f"bench: no benchmark named {', '.join(unknown)} (known: {', '.join(BY_NAME)})", file=sys.stderr)
        sys.exit(2)
    return [BY_NAME[n] for n in names] if names else list(SUITE)


def figures(text: str, width: int = 120) -> list[str]:
    """A log's verdict and headline-figure lines (harness.verdict, harness.key_figure), cut to ``width``."""
    lines = [line.strip() for line in text.splitlines() if line.startswith(MARKS)]
    return [line if len(line) <= width else line[:width - 3] + "..." for line in lines]


def run_one(bench: Bench, out: Path, *, timeout: float, keep: bool = False) -> dict[str, object]:
    """Run one benchmark into ``out``; its status, wall time, verdicts, headline figures and log."""
    log = out / f"{bench.name}.log"
    if reason := why_not(bench):
        return {"status": "skipped", "detail": reason, "seconds": 0.0, "log": None, "figures": []}
    cmd = [sys.executable, str(bench.script), *bench.args]
    if bench.work is not None:
        cmd += [bench.work, str(out / bench.name)]
    tmp = out / f"{bench.name}-tmp"  # what a benchmark puts in tempfile's folder lands here too, never in /tmp
    tmp.mkdir(exist_ok=True)
    started = time.perf_counter()
    with open(log, "w") as fh:
        fh.write("$ " + " ".join(cmd) + "\n")
        fh.flush()
        try:
            code = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, timeout=timeout, cwd=HERE.parent,
                                  env={**os.environ, "TMPDIR": str(tmp), "PATH": PATH}).returncode
        except subprocess.TimeoutExpired:
            code = None
    if not keep:  # the log holds the figures; the work folders of quick runs are not worth their disk
        for path in (tmp, out / bench.name):
            shutil.rmtree(path, ignore_errors=True)
    seconds = time.perf_counter() - started
    text = log.read_text(errors="replace")
    passed, failed = text.count("  PASS  "), text.count("  FAIL  ")
    if code is None:
        status, detail = "failed", f"over {timeout:.0f} s"
    elif code != 0:
        last = [line for line in text.strip().splitlines() if line.strip()][-1:]
        status, detail = "failed", f"exit {code}: {last[0][:100] if last else ''}"
    else:
        status, detail = "ok", f"{passed} PASS, {failed} FAIL" if passed or failed else \
            "figures below" if KEY in text else "figures in the log"
    if peers := missing_anchors(bench):
        detail += f"; not installed: {', '.join(peers)}"
    shown = (figures(text) if code == 0 else []) + ([f"NOTE  quick run: {bench.note}"] if bench.note else [])
    return {"status": status, "detail": detail, "seconds": seconds, "figures": shown,
            "log": str(log.relative_to(HERE.parent)) if log.is_relative_to(HERE.parent) else str(log)}


def row(name: str, r: dict[str, object]) -> str:
    """The table's lines for one benchmark: status, wall time, detail, log; then its figures, indented."""
    head = f"{name:<14} {r['status']:<8} {r['seconds']:>7.1f} s  {r['detail']}" + (f"  [{r['log']}]" if r["log"] else "")
    return "\n".join([head, *(f"      {line}" for line in r["figures"])])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default=os.environ.get("BENCH", ""), help="names, comma-separated (default: all)")
    ap.add_argument("--out", type=Path, default=HERE.parent / "build" / "bench", help="work folders and logs")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds one benchmark may take")
    ap.add_argument("--list", action="store_true", help="list the benchmarks and whether each can run here")
    ap.add_argument("--keep", action="store_true", help="keep each benchmark's work folder (default: its log only)")
    args = ap.parse_args()
    chosen = choose(args.only)
    args.out = args.out.resolve()  # the benchmarks run from the repository root
    if args.list:
        for b in chosen:
            peers = missing_anchors(b)
            print(f"{b.name:<14} {why_not(b) or 'runs here'}" + (f"; not installed: {', '.join(peers)}" if peers else ""))
        if not args.only:
            print("\nnot run by the suite:\n" + "\n".join(f"{name:<17} {why}" for name, why in NOT_RUN.items()
                                                           if why != NOT_RUN["harness"]))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[str, object]] = {}
    print(f"bench: {len(chosen)} benchmarks at quick sizes into {args.out} (load average {os.getloadavg()[0]:.2f})",
          flush=True)
    for k, b in enumerate(chosen, 1):
        print(f"[{k}/{len(chosen)}] {b.name} ...", flush=True)
        results[b.name] = run_one(b, args.out, timeout=args.timeout, keep=args.keep)
        print(row(b.name, results[b.name]), flush=True)
    print(f"\n{'benchmark':<14} {'status':<8} {'wall':>9}  figures")
    for name, r in results.items():
        print(row(name, r))
    print("\nAt these quick sizes fixed costs (start-up, tokenizer load) weigh more than at the sizes each goal is set "
          "for, so some verdicts FAIL here that pass there: the figures of record are bench/README.md's.")
    report_missing(chosen)
    if any(r["status"] == "failed" for r in results.values()):
        sys.exit(1)


def report_missing(chosen: list[Bench]) -> None:
    """Name the peer tools and modules the chosen benchmarks lack, grouped by the command that installs them."""
    modules = sorted({m for b in chosen for m in missing_anchors(b)} | {m for b in chosen for m in b.needs if not has(m)})
    if not modules:
        return
    print("\nnot installed here (the rows that compare with them say 'not installed'; benchmarks that need them "
          "are skipped):")
    for command in dict.fromkeys(install(m) for m in modules):
        print(f"  {', '.join(m for m in modules if install(m) == command)}: {command}")


if __name__ == "__main__":
    main()
