"""Early signals (issue 26): SIGINT or SIGTERM at a random moment of each command's first second,
and what the user sees. Not a benchmark of speed: a count of outcomes, one run.

    python bench/campaign_signals.py [--trials 100] [--window 0.8] [--workdir /tmp/shardsmith-signals]

Each trial starts ``python -m shardsmith COMMAND ... -q`` on small inputs made here, sleeps a random
time in [0, window) seconds, sends SIGINT or SIGTERM (chosen at random), and sorts the outcome:

- ``finished``: the command ended before the signal (exit 0);
- ``one line``: exit 130/143 and stderr is exactly shardsmith's "interrupted" line;
- ``ended by the signal``: status -2/-15 and no output (the interpreter had no handler yet);
- ``interpreter start-up``: a traceback none of whose frames is shardsmith's (Python's own start-up:
  ``site``, ``runpy``; before shardsmith's first line runs, nothing of ours can catch it);
- ``traceback`` / ``crash`` / ``other``: a traceback through shardsmith, a process killed by another
  signal (SIGSEGV, SIGABRT), anything else. The goal is zero of these.
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
MESSAGE = "shardsmith: interrupted: run the same command again to resume"


def make_inputs(work: Path) -> dict[str, list[str]]:
    """Inputs for each command (small: the first second is what is tested), and its arguments."""
    sys.path.insert(0, str(HERE.parent))
    from shardsmith.demo.root_files import make_icecube_like

    corpus = work / "corpus"
    corpus.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    words = ["alpha", "beta", "gamma", "delta", "shard", "token"]
    with open(corpus / "a.jsonl", "w") as fh:
        for _ in range(4000):
            fh.write(json.dumps({"text": " ".join(rng.choice(words) for _ in range(40))}) + "\n")
    images = HERE.parent / "examples" / "images"  # the repository's small image folder
    root = work / "events.root"
    make_icecube_like(root, events=20000, mean_pulses=10, seed=0)
    tok = work / "tok"
    subprocess.run([sys.executable, "-m", "shardsmith", "pack-tokens", str(corpus), "-o", str(tok),
                    "--train-tokenizer", "400", "-q"], check=True)
    return {
        "pack-tokens": ["pack-tokens", str(corpus), "--tokenizer", str(tok / "tokenizer.json")],
        "convert-webdataset": ["convert", str(images), "--to", "webdataset"],
        "convert-hdf5": ["convert", str(root), "--to", "hdf5"],
        "verify": ["verify", str(tok)],
        "inspect": ["inspect", str(tok)],
    }


def classify(code: int, err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.strip()]
    if code == 0:
        return "finished"
    if code in (130, 143) and lines == [MESSAGE]:
        return "one line"
    if code in (-signal.SIGINT, -signal.SIGTERM) and not lines:
        return "ended by the signal"
    if "Traceback" in err or "Fatal Python error" in err:
        return "traceback" if "/shardsmith/" in err else "interpreter start-up"
    if code < 0:
        return f"crash ({signal.Signals(-code).name})"
    return f"other (exit {code})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--window", type=float, default=0.8)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/shardsmith-signals"))
    ap.add_argument("--seed", type=int, default=26)
    args = ap.parse_args()
    shutil.rmtree(args.workdir, ignore_errors=True)
    commands = make_inputs(args.workdir)
    rng = random.Random(args.seed)
    out = args.workdir / "out"
    table: dict[str, collections.Counter[str]] = {}
    examples: dict[str, str] = {}
    for name, argv in commands.items():
        counts = table.setdefault(name, collections.Counter())
        for _ in range(args.trials):
            for p in (out, out.parent / f".{out.name}.shardsmith-work"):
                shutil.rmtree(p, ignore_errors=True)
            full = [sys.executable, "-m", "shardsmith", *argv, *(["-o", str(out)] if "convert" in name
                                                                or name == "pack-tokens" else []), "-q"]
            if name in ("verify", "inspect"):
                full = full[:-1]
            proc = subprocess.Popen(full, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            time.sleep(rng.uniform(0, args.window))
            proc.send_signal(rng.choice([signal.SIGINT, signal.SIGTERM]))
            err = proc.communicate(timeout=60)[1]
            kind = classify(proc.returncode, err)
            counts[kind] += 1
            if kind not in ("finished", "one line", "ended by the signal"):
                examples.setdefault(f"{name}: {kind}", err[-1500:])
        print(f"{name:20s} {dict(counts)}", flush=True)
    for key, err in examples.items():
        print(f"\n== {key}\n{err}")


if __name__ == "__main__":
    main()
