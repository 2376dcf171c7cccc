"""Two checkouts' loaders side by side (issue 44, item 5): the loader's measured paths, each with its
peer tool, alternated row by row so that both checkouts see the same load.

    python bench/ab_loader.py --base /path/to/old/checkout [--new .] [--repeat 7] [--only tokens,tar,mix,resume]

Measures (the same code and inputs for both checkouts; the inputs are written once, by the new one):
- ``tokens``: ``TokenDataset.get_batch`` (B=32, L=256, + ``torch.from_numpy``) against nanoGPT's
  ``get_batch`` (its memmap re-created per batch, as in its ``train.py``), batches/s over 0.5 s
  (``bench_pack_tokens.get_batch_section``'s loop) on --tokens tokens;
- ``tar``: ``TarDataset.iter(shuffle=True)`` over --tar-samples samples (--tar-shards shards) against ``webdataset.WebDataset``
  in order (``bench_tar_loader.py``'s inputs), and the same in batches of 64 by ``ds.iter`` and the
  torch adapter ``TarIterable``; where the checkout has a skip policy, the batched ``ds.iter`` again
  with ``on_error="skip"`` (nothing skipped): what the policy costs;
- ``mix``: a mixture of three token sources (--windows, twice and three times as many windows of 128)
  read in batches of 256, against each source alone in its shuffled epoch order (``bench_mix.py``);
- ``resume``: ``TokenBatches`` (batch 32) under torchdata's ``StatefulDataLoader`` with 2 workers on
  --resume-samples windows of 32, state saved half way through the epoch: seconds from a new loader and
  its ``load_state_dict`` to the first batch, checked against the uninterrupted run's; and a fresh
  epoch's first batch (the floor) (``bench_resume.py``).
Each checkout runs one server process (``PYTHONPATH`` set to it, this interpreter: the same
dependencies) that opens the inputs once; the driver asks them for one timing of a row at a time,
base then new, new then base, ... --repeat times. The in-process rows count the server's CPU seconds
(``--clock cpu``, the default: on a machine shared with other work, wall time measures the scheduler
as much as the code; single-threaded rows lose nothing by it), resume counts wall seconds. Prints per row the medians, new/base with the
spread of the paired ratios, and each side's ratio to its peer (computed within each repeat).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MEASURES = ("tokens", "tar", "mix", "resume")
# each measure's peer ratio: (label, the row measured, the peer's row, or None: the slowest of the rows named)
PEERS = {
    "tokens": [("x nanoGPT", "get_batch batches/s", "nanoGPT get_batch batches/s")],
    "tar": [("x webdataset", "iter(shuffle=True) samples/s", "webdataset in order samples/s"),
            ("x skip/raise", "iter(batch_size=64, on_error='skip') samples/s", "iter(batch_size=64) samples/s")],
    "mix": [("x slowest source", "mixed windows/s", None)],
    "resume": [],
}


# ---------------------------------------------------------------- the server (the checkout on PYTHONPATH)

CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}
clock = CLOCKS["cpu"]  # the in-process rows' clock (--clock): the server's CPU seconds by default


def _rate(fn: Callable[[], Any], seconds: float = 0.5) -> float:
    """Calls of ``fn`` per second of ``clock`` over ``seconds`` of it."""
    n, t0 = 0, clock()
    while (dt := clock() - t0) < seconds:
        fn()
        n += 1
    return n / dt


def _per_second(n: int, fn: Callable[[], Any]) -> float:
    """``n`` over the seconds of ``clock`` one call of ``fn`` takes."""
    t0 = clock()
    fn()
    return n / (clock() - t0)


def rows_tokens(work: Path) -> dict[str, Callable[[], float]]:
    import numpy as np
    import torch
    from harness import nanogpt_get_batch

    import shardsmith

    block, batch = 256, 32
    ds = shardsmith.TokenDataset(str(work / "tokens"), seq_len=block, split="train")
    train_bin = work / "tokens" / "train.bin"
    rng = np.random.default_rng(0)

    def ours() -> None:
        x, y = ds.get_batch(rng.integers(0, len(ds), batch))
        torch.from_numpy(x), torch.from_numpy(y)

    def nanogpt() -> None:  # nanoGPT train.py: the memmap is re-created for every batch
        nanogpt_get_batch(train_bin, block=block, batch=batch)

    ours(), nanogpt()
    return {"get_batch batches/s": lambda: _rate(ours), "nanoGPT get_batch batches/s": lambda: _rate(nanogpt)}


def rows_tar(work: Path) -> dict[str, Callable[[], float]]:
    import inspect

    from shardsmith.formats.webdataset.dataset import TarDataset

    ds = TarDataset(work / "tar")
    n = len(ds)
    for p in ds.shard_paths:  # warm the page cache
        p.read_bytes()

    def shuffled() -> None:
        for _ in ds.iter(shuffle=True, seed=0, epoch=0):
            pass

    def wds() -> None:
        for _ in ds.webdataset():
            pass

    def batched(**skip: Any) -> None:
        for _ in ds.iter(shuffle=True, seed=0, epoch=0, batch_size=64, **skip):
            pass

    rows = {"iter(shuffle=True) samples/s": lambda: _per_second(n, shuffled),
            "webdataset in order samples/s": lambda: _per_second(n, wds),
            "iter(batch_size=64) samples/s": lambda: _per_second(n, batched)}
    if "on_error" in inspect.signature(ds.iter).parameters:
        rows["iter(batch_size=64, on_error='skip') samples/s"] = lambda: _per_second(
            n, lambda: batched(on_error="skip"))
    try:
        from shardsmith.torch import TarIterable
    except ImportError:
        return rows

    def adapter() -> None:
        for _ in TarIterable(ds, batch_size=64, seed=0, rank=0, world_size=1):
            pass

    rows["TarIterable(batch_size=64) samples/s"] = lambda: _per_second(n, adapter)
    return rows


def rows_mix(work: Path, batch: int = 256) -> dict[str, Callable[[], float]]:
    import numpy as np

    import shardsmith
    from shardsmith.kit.order import epoch_order
    from shardsmith.loader import mix

    weights = {"web": 0.5, "code": 0.3, "books": 0.2}
    parts = {name: shardsmith.TokenDataset(str(work / "mix" / name)) for name in weights}
    steps = len(parts["web"]) // batch

    def alone(ds: Any) -> None:
        order = epoch_order(len(ds), shuffle=True, seed=0, epoch=0)
        for s in range(steps):
            ds.get_batch(order[s * batch:(s + 1) * batch])

    m = mix(parts, weights, seed=0, num_samples=steps * batch)

    def mixed() -> None:
        for s in range(steps):
            m.get_batch(np.arange(s * batch, (s + 1) * batch))

    rows = {f"{name} alone windows/s": (lambda ds=ds: _per_second(steps * batch, lambda: alone(ds)))
            for name, ds in parts.items()}
    rows["mixed windows/s"] = lambda: _per_second(steps * batch, mixed)
    return rows


def rows_resume(work: Path, workers: int = 2) -> dict[str, Callable[[], float]]:
    import warnings

    import torch
    from bench_resume import first_batch, loader, state_at

    import shardsmith
    from shardsmith.torch import TokenBatches

    warnings.filterwarnings("ignore")
    ds = shardsmith.TokenDataset(str(work / "resume"))
    opts = {"batch_size": 32, "seed": 0, "rank": 0, "world_size": 1}
    steps = len(TokenBatches(ds, **opts)) // 2
    state, want = state_at(TokenBatches(ds, **opts), workers, steps)

    def resumed() -> float:
        seconds, x = first_batch(lambda: loader(TokenBatches(ds, **opts), workers), state)
        assert torch.equal(x, want), "the first batch after the resume differs from the uninterrupted run's"
        return seconds

    return {"resume to the first batch s": resumed,
            "fresh epoch s": lambda: first_batch(lambda: loader(TokenBatches(ds, **opts), workers), None)[0]}


ROWS = {"tokens": rows_tokens, "tar": rows_tar, "mix": rows_mix, "resume": rows_resume}


def serve(work: Path, clock_name: str) -> None:
    """Answer the driver's lines on stdin: ``rows MEASURE`` (the row names, opening the inputs) and
    ``time MEASURE ROW`` (one timing), each with one JSON line on stdout."""
    global clock
    clock = CLOCKS[clock_name]
    opened: dict[str, dict[str, Callable[[], float]]] = {}
    for line in sys.stdin:
        verb, measure, *row = line.rstrip("\n").split(" ", 2)
        if measure not in opened:
            opened[measure] = ROWS[measure](work)
        answer: Any = list(opened[measure]) if verb == "rows" else opened[measure][row[0]]()
        print(json.dumps(answer), flush=True)


# ---------------------------------------------------------------- inputs (written once, by the new checkout)

def prepare(work: Path, *, tokens: int, tar_samples: int, tar_shards: int, windows: int,
            resume_samples: int) -> None:
    import numpy as np
    from bench_resume import write_tokens
    from bench_tar_loader import write_dataset

    if not (work / "tokens" / "train.bin").exists():
        seq_len = 256
        out = write_tokens(work / "tokens", windows=tokens // seq_len, seq_len=seq_len)
        flat = np.concatenate([np.fromfile(p, dtype=np.uint16) for p in sorted(out.glob("train-*.bin"))])
        flat.tofile(out / "train.bin")  # the same ids as nanoGPT's flat file
    if not (work / "tar").exists():
        write_dataset(work / "tar", samples=tar_samples, shards=tar_shards)
    for k, name in enumerate(("web", "code", "books")):
        if not (work / "mix" / name).exists():
            write_tokens(work / "mix" / name, windows=windows * (k + 1), seq_len=128)
    if not (work / "resume").exists():
        write_tokens(work / "resume", windows=resume_samples, seq_len=32)


# ---------------------------------------------------------------- the driver

class Server:
    """One checkout's server process."""

    def __init__(self, checkout: Path, work: Path, clock_name: str) -> None:
        self.checkout = checkout
        env = {**os.environ, "PYTHONPATH": str(checkout)}
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--serve", str(work),
                                      "--clock", clock_name], env=env,
                                     cwd=checkout, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def ask(self, line: str) -> Any:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        if not answer:
            raise SystemExit(f"{self.checkout}: the server ended at {line!r} (exit {self.proc.wait()})")
        return json.loads(answer)

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait()


def peer_ratios(measure: str, values: dict[str, float]) -> dict[str, float]:
    """The measure's peer ratios from one repeat's values of one side (rows it lacks: left out)."""
    out = {}
    for label, row, peer in PEERS[measure]:
        if row not in values:
            continue
        if peer is None:
            out[label] = values[row] / min(v for k, v in values.items() if k != row)
        elif peer in values:
            out[label] = values[row] / values[peer]
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", type=Path, help="the checkout to compare against")
    ap.add_argument("--new", type=Path, default=HERE.parent, help="the checkout measured (default: this one)")
    ap.add_argument("--workdir", type=Path, default=None, help="inputs, kept (default: a temporary folder)")
    ap.add_argument("--repeat", type=int, default=7, help="timings of each row and checkout, alternated (default 7)")
    ap.add_argument("--only", default=",".join(MEASURES), help=f"some of {','.join(MEASURES)}")
    ap.add_argument("--tokens", type=int, default=25_000_000, help="tokens for get_batch (default 25M)")
    ap.add_argument("--tar-samples", type=int, default=20_000)
    ap.add_argument("--tar-shards", type=int, default=4, help="shards they are written in (default 4)")
    ap.add_argument("--windows", type=int, default=200_000, help="the smallest mixture source (default 200k)")
    ap.add_argument("--resume-samples", type=int, default=1_000_000)
    ap.add_argument("--clock", choices=sorted(CLOCKS), default="cpu",
                    help="the in-process rows' clock: the process's CPU seconds (default: what a shared, loaded "
                         "machine disturbs least) or wall seconds; resume is always wall (workers)")
    ap.add_argument("--serve", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--prepare", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    sys.path.insert(0, str(HERE))
    if a.serve:
        return serve(a.serve, a.clock)
    if a.prepare:
        return prepare(a.prepare, tokens=a.tokens, tar_samples=a.tar_samples, tar_shards=a.tar_shards, windows=a.windows,
                       resume_samples=a.resume_samples)
    if a.base is None:
        ap.error("--base is required")
    measures = [m for m in a.only.split(",") if m]
    if unknown := set(measures) - set(MEASURES):
        ap.error(f"--only: unknown {', '.join(sorted(unknown))}")
    with tempfile.TemporaryDirectory(prefix="ab-loader-") as tmp:
        work = a.workdir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        sides = {"base": a.base.resolve(), "new": a.new.resolve()}
        sizes = ["--tokens", str(a.tokens), "--tar-samples", str(a.tar_samples),
                 "--tar-shards", str(a.tar_shards), "--windows", str(a.windows),
                 "--resume-samples", str(a.resume_samples)]
        subprocess.run([sys.executable, str(Path(__file__).resolve()), "--prepare", str(work), *sizes], check=True,
                       env={**os.environ, "PYTHONPATH": str(sides["new"])}, cwd=sides["new"])
        print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; base {sides['base']}, "
              f"new {sides['new']}; clock {a.clock} (resume: wall)", flush=True)
        servers = {side: Server(checkout, work, a.clock) for side, checkout in sides.items()}
        try:
            report(servers, measures, a.repeat)
        finally:
            for server in servers.values():
                server.close()
        print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def report(servers: dict[str, Server], measures: list[str], repeat: int) -> None:
    print(f"\n{'measure: row':58s} {'base':>10s} {'new':>10s} {'new/base':>8s}  paired new/base: "
          f"median (min-max) of {repeat}")
    for measure in measures:
        rows = {side: s.ask(f"rows {measure}") for side, s in servers.items()}
        got: dict[tuple[str, str], list[float]] = {}
        for r in range(repeat):
            for row in rows["new"]:
                for side in (("base", "new") if r % 2 == 0 else ("new", "base")):
                    if row in rows[side]:
                        got.setdefault((row, side), []).append(servers[side].ask(f"time {measure} {row}"))
        for side in servers:
            for r in range(repeat):
                values = {row: got[(row, side)][r] for row in rows[side] if (row, side) in got}
                for label, value in peer_ratios(measure, values).items():
                    got.setdefault((label, side), []).append(value)
        for row in dict.fromkeys(row for row, _ in got):
            base, new = got.get((row, "base")), got[(row, "new")]
            fmt = "{:10.2f}" if row.startswith("x ") or row.endswith(" s") else "{:10,.0f}"
            mn = statistics.median(new)
            if base is None:
                print(f"{measure + ': ' + row:58s} {'-':>10s} {fmt.format(mn)}  (new only)", flush=True)
                continue
            mb = statistics.median(base)
            pairs = [n / b for b, n in zip(base, new)]
            print(f"{measure + ': ' + row:58s} {fmt.format(mb)} {fmt.format(mn)} {mn / mb:8.3f}  "
                  f"{statistics.median(pairs):.3f} ({min(pairs):.2f}-{max(pairs):.2f})", flush=True)


if __name__ == "__main__":
    main()
