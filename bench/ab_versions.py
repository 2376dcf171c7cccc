"""Two checkouts of shardsmith side by side on the same inputs: the conversions (pack-tokens, images to
webdataset, ROOT events to hdf5, memmap and event-tar) and ``shardsmith bench`` on every format, run
interleaved so that both see the same load. For a change that must not move the figures (issue 27,
a refactor), the ratios should sit within the noise of repeated runs of one checkout.

    python bench/ab_versions.py --base /path/to/old/checkout [--new .] [--repeat 3] [--mb 50]

Each checkout runs with ``PYTHONPATH`` set to it, under this interpreter (so the same dependencies).
Prints one row per measure: the medians of base and new and new/base.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

def _inputs(work: Path, mb: float, images: int, events: int) -> dict[str, Path]:
    from corpus import write_corpus
    from images import ensure_imagefolder
    from make_tokenizers import make_tokenizers

    from shardsmith.demo.root_files import make_icecube_like

    work.mkdir(parents=True, exist_ok=True)
    corpus = work / "corpus" / "a.jsonl"
    if not corpus.exists():
        corpus.parent.mkdir(parents=True, exist_ok=True)
        write_corpus(corpus, mb)
    tok = work / "tok" / "bpe.json"
    if not tok.exists():
        tok = make_tokenizers(corpus, work / "tok")["bpe"]
    folder = work / "images"
    ensure_imagefolder(folder, images, classes=20)
    root = work / "events" / "run.root"
    if not root.exists():
        root.parent.mkdir(parents=True, exist_ok=True)
        make_icecube_like(root, events=events, mean_pulses=30, seed=1)
    return {"corpus": corpus.parent, "tokenizer": tok, "images": folder, "root": root.parent}


def _conversions(inp: dict[str, Path], out: Path) -> dict[str, list[str]]:
    common = ["--overwrite", "-q", "--workers", "2"]
    return {
        "pack-tokens": ["pack-tokens", str(inp["corpus"]), "-o", str(out / "tokens"), "--tokenizer",
                        str(inp["tokenizer"]), *common],
        "images->webdataset": ["convert", str(inp["images"]), "-o", str(out / "webdataset"), "--to", "webdataset",
                               *common],
        "root->hdf5": ["convert", str(inp["root"]), "-o", str(out / "hdf5"), "--to", "hdf5", *common],
        "root->memmap": ["convert", str(inp["root"]), "-o", str(out / "memmap"), "--to", "memmap", "--max-len", "64",
                         "--branches", "pulses_time,pulses_charge,pulses_dom_x,event_id,zenith", *common],
        "root->event-tar": ["convert", str(inp["root"]), "-o", str(out / "event-tar"), "--to", "webdataset", *common],
    }


def _run(checkout: Path, args: list[str]) -> tuple[float, str]:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "shardsmith", *args], env=env, capture_output=True, text=True,
                          cwd=checkout)
    if done.returncode != 0:
        raise SystemExit(f"{checkout}: shardsmith {' '.join(args)}: exit {done.returncode}\n{done.stderr[-2000:]}")
    return time.perf_counter() - t0, done.stdout


_RATE = re.compile(r"([\d,.]+)\s*(tokens/s|samples/s|events/s|batches/s)")


def _rate(stdout: str) -> tuple[float, str]:
    """The first rate ``shardsmith bench`` prints (batches/s for tokens, samples/s, events/s) and its unit."""
    found = _RATE.search(stdout)
    if not found:
        raise SystemExit(f"no rate in: {stdout[-500:]}")
    return float(found.group(1).replace(",", "")), found.group(2)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", type=Path, required=True, help="the checkout to compare against")
    ap.add_argument("--new", type=Path, default=HERE.parent, help="the checkout measured (default: this one)")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/shardsmith-ab"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--mb", type=float, default=50, help="MB of JSONL for pack-tokens (default 50)")
    ap.add_argument("--images", type=int, default=5000, help="images for convert (default 5,000)")
    ap.add_argument("--events", type=int, default=200_000, help="ROOT events for convert (default 200,000)")
    ap.add_argument("--seconds", type=float, default=2.0, help="each shardsmith bench run (default 2)")
    a = ap.parse_args(argv)
    print(f"load average at start: {os.getloadavg()}", flush=True)
    inp = _inputs(a.workdir / "inputs", a.mb, a.images, a.events)
    sides = {"base": a.base.resolve(), "new": a.new.resolve()}
    times: dict[tuple[str, str], list[float]] = {}
    for r in range(a.repeat):
        for side, checkout in (sides.items() if r % 2 == 0 else reversed(sides.items())):
            out = a.workdir / side
            for name, args in _conversions(inp, out).items():
                times.setdefault((name, side), []).append(_run(checkout, args)[0])
            for fmt in ("tokens", "webdataset", "hdf5", "memmap", "event-tar"):
                stdout = _run(checkout, ["bench", str(out / fmt), "--seconds", str(a.seconds)])[1]
                rate, unit = _rate(stdout)
                times.setdefault((f"bench {fmt} ({unit})", side), []).append(rate)
    print(f"{'measure (s, or a rate)':28s} {'base':>14s} {'new':>14s} {'new/base':>9s}")
    for name in dict.fromkeys(n for n, _ in times):
        base, new = statistics.median(times[(name, "base")]), statistics.median(times[(name, "new")])
        print(f"{name:28s} {base:14.3f} {new:14.3f} {new / base:9.3f}")
    print(f"load average at end: {os.getloadavg()}")
    shutil.rmtree(a.workdir / "base", ignore_errors=True)
    shutil.rmtree(a.workdir / "new", ignore_errors=True)


if __name__ == "__main__":
    main()
