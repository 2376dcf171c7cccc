"""Weighted mixtures (issue 16, point 4): building the order, memory per fetch, mixed samples/s.

Order building, --samples samples of 3 sources (weights 0.5 / 0.3 / 0.2):
- ``megatron``: megatron-core's ``helpers.build_blending_indices`` (its compiled C++ helper, what
  ``BlendedDataset`` runs) filling the two arrays of --samples entries it needs (allocation included);
- ``mix``: ``shardsmith.loader.mix(...)`` ready to fetch (no order array exists: sample i is found
  by a few roundings), then the first sample's place;
- ``mix, all``: for comparison only, every sample's (source, index) materialised by ``locate`` in
  chunks (the interleave alone, and with the per-source Feistel shuffle).
Memory per fetch: tracemalloc's peak while locating one sample (megatron: its two arrays).
Many sources: the same with 8 sources of random weights (``mix`` then builds one period of
65,536 positions, loader/interleave.py), and the largest |count - weight·n| over the first 1M
prefixes of each: ours stays below 1, megatron's greedy does not promise it.
Mixed samples/s: three token datasets (--windows windows each, written directly), batches of
--batch-size from the mixture's order against each source alone in its own shuffled order; then
the same mixture with a schedule (weights 0.5/0.3/0.2 at sample 0 moving linearly to 0.2/0.3/0.5
at the middle: ``loader/ramp.py``'s exact interleave).

    .venv/bin/python bench/bench_mix.py [--samples 10000000] [--windows 200000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import tracemalloc
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_resume import write_tokens  # noqa: E402
from harness import code_version, key_figure, median_time  # noqa: E402

import shardsmith  # noqa: E402
from shardsmith.kit.dataset import Dataset  # noqa: E402
from shardsmith.kit.order import epoch_order  # noqa: E402
from shardsmith.kit.sample_kind import ListForm, SampleKind  # noqa: E402
from shardsmith.loader import Schedule, mix  # noqa: E402

WEIGHTS = {"web": 0.5, "code": 0.3, "books": 0.2}


class Sized(Dataset):
    """A source of n samples for order building (nothing is read)."""

    kind = SampleKind("sized", ListForm())

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n


def megatron_build(n: int, weights: dict[str, float] = WEIGHTS) -> tuple[np.ndarray, np.ndarray]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets import helpers
    index = np.zeros(n, dtype=np.int16)
    sample = np.zeros(n, dtype=np.int64)
    w = np.array(list(weights.values()), dtype=np.float64)
    helpers.build_blending_indices(index, sample, w / w.sum(), len(weights), n, False)
    return index, sample


def order_rows(n: int, repeat: int) -> None:
    sources = {name: Sized(n) for name in WEIGHTS}  # big enough: nothing cycles
    t_meg = median_time(lambda: megatron_build(n), repeat)
    index, sample = megatron_build(n)

    def ours():
        m = mix(sources, WEIGHTS, seed=0, num_samples=n)
        m.locate([n // 2])

    t_mix = median_time(ours, max(repeat, 20))
    m = mix(sources, WEIGHTS, seed=0, num_samples=n)
    m_plain = mix(sources, WEIGHTS, seed=0, num_samples=n, shuffle=False)

    def all_of(mx, chunk=1 << 20):
        for lo in range(0, n, chunk):
            mx.locate(np.arange(lo, min(n, lo + chunk)))

    t_plain = median_time(lambda: all_of(m_plain), 1)
    t_all = median_time(lambda: all_of(m), 1)
    # the same counts as megatron's greedy at every 1000th prefix, within 1 of weight·n
    src, _ = m_plain.locate(np.arange(min(n, 1_000_000)))
    ours_counts = np.cumsum(np.eye(3, dtype=np.int64)[src], axis=0)[999::1000]
    meg_counts = np.cumsum(np.eye(3, dtype=np.int64)[index[:min(n, 1_000_000)]], axis=0)[999::1000]
    tracemalloc.start()
    m.locate([n - 7])
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(f"order, {n:,} samples of 3 sources (weights 0.5/0.3/0.2)")
    print(f"  megatron build_blending_indices (C++): {t_meg * 1e3:9.2f} ms   memory {index.nbytes + sample.nbytes:,} B")
    print(f"  shardsmith mix, ready + 1st sample   : {t_mix * 1e3:9.3f} ms   memory per fetch {peak:,} B "
          f"-> {t_meg / t_mix:,.0f}x faster")
    print(f"  (mix, all {n:,} located: interleave {t_plain:.2f} s, with per-source shuffle {t_all:.2f} s)")
    print(f"  counts differ from megatron's by at most {np.abs(ours_counts - meg_counts).max()} at every 1000th prefix")
    key_figure(f"order, {n:,} samples", f"ready {t_meg / t_mix:,.0f}x sooner than megatron's, {peak:,} B a fetch "
               f"against its {(index.nbytes + sample.nbytes) / 1e6:,.1f} MB")


def deviation(source: np.ndarray, share: np.ndarray) -> float:
    """The largest |count - weight·n| over every prefix of ``source`` (source numbers)."""
    counts = np.cumsum(np.eye(len(share), dtype=np.int64)[source], axis=0)
    return float(np.abs(counts - np.arange(1, len(source) + 1)[:, None] * share).max())


def many_sources_rows(n: int, repeat: int) -> None:
    rng = np.random.default_rng(7)
    weights = {f"s{k}": float(x) for k, x in enumerate(rng.random(8) ** 2 + 0.01)}
    sources = {name: Sized(n) for name in weights}
    t_meg = median_time(lambda: megatron_build(n, weights), repeat)
    index, _ = megatron_build(n, weights)

    def ours():
        mix(sources, weights, seed=0, num_samples=n).locate([n // 2])

    t_mix = median_time(ours, repeat)
    m = mix(sources, weights, seed=0, num_samples=n, shuffle=False)
    tracemalloc.start()
    m.locate([n - 7])
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    share = np.array([m.weights[k] for k in weights])
    given = np.array(list(weights.values())) / sum(weights.values())
    first = min(n, 1_000_000)
    src, _ = m.locate(np.arange(first))
    print(f"order, {n:,} samples of 8 sources (random weights; period {m._interleave.period:,})")
    print(f"  megatron build_blending_indices (C++): {t_meg * 1e3:9.2f} ms   max |count - w·n| "
          f"{deviation(index[:first].astype(np.int64), given):.6f} (first {first:,} prefixes)")
    print(f"  shardsmith mix, ready + 1st sample   : {t_mix * 1e3:9.2f} ms   max |count - w·n| "
          f"{deviation(src, share):.6f}; table {m._interleave.period * 5:,} B, memory per fetch {peak:,} B "
          f"-> {t_meg / t_mix:,.1f}x faster")
    print(f"  (shares used differ from the given weights by at most {np.abs(share - given).max():.1e})")


def throughput_rows(windows: int, batch: int, repeat: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        parts = {name: shardsmith.TokenDataset(write_tokens(Path(tmp) / name, windows=windows * (k + 1),
                                                            seq_len=128))
                 for k, name in enumerate(WEIGHTS)}
        steps = windows // batch

        def alone(ds):
            order = epoch_order(len(ds), shuffle=True, seed=0, epoch=0)
            for s in range(steps):
                ds.get_batch(order[s * batch:(s + 1) * batch])

        m = mix(parts, WEIGHTS, seed=0, num_samples=steps * batch)

        def mixed():
            for s in range(steps):
                m.get_batch(np.arange(s * batch, (s + 1) * batch))

        ramp = Schedule(at=[0, steps * batch // 2], weights={"web": [0.5, 0.2], "code": [0.3, 0.3], "books": [0.2, 0.5]})
        ms = mix(parts, ramp, seed=0, num_samples=steps * batch)

        def scheduled():
            for s in range(steps):
                ms.get_batch(np.arange(s * batch, (s + 1) * batch))

        rates = {name: steps * batch / median_time(lambda ds=ds: alone(ds), repeat) for name, ds in parts.items()}
        slowest = min(rates, key=rates.get)
        rate = steps * batch / median_time(mixed, repeat)
        rate_s = steps * batch / median_time(scheduled, repeat)
        print(f"mixed reading: {steps * batch:,} windows of 128 tokens, batches of {batch}")
        print("  alone: " + ", ".join(f"{k} {v:,.0f}/s" for k, v in rates.items()))
        print(f"  mixed: {rate:,.0f}/s = {rate / rates[slowest]:.2f} x the slowest source ({slowest}) alone")
        print(f"  scheduled (0.5/0.3/0.2 -> 0.2/0.3/0.5): {rate_s:,.0f}/s = {rate_s / rates[slowest]:.2f} x the "
              f"slowest source alone")
        key_figure("mixed reading", f"{rate:,.0f} windows/s, {rate / rates[slowest]:.2f}x the slowest source alone")
        key_figure("scheduled mixed reading", f"{rate_s:,.0f} windows/s, {rate_s / rates[slowest]:.2f}x the slowest "
                   f"source alone")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=10_000_000)
    ap.add_argument("--windows", type=int, default=200_000)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print(f"code {code_version()}")
    order_rows(args.samples, args.repeat)
    many_sources_rows(args.samples, args.repeat)
    throughput_rows(args.windows, args.batch_size, args.repeat)


if __name__ == "__main__":
    main()
