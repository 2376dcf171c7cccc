"""Best-fit packing (issue 16 point 6): padding, split documents and the extra wall time of
``pack-tokens --pack best-fit`` over plain ``pack-tokens``, on the bench corpus.

    python bench/bench_pack.py [--mb 50] [--repeat 3] [--workdir /tmp/shardsmith-bench-pack] [--memory 1GB]

The corpus (bench/corpus.py, documents of about 250 B to 10 KB) and the byte-level BPE
(bench/make_tokenizers.py) are made once in the work folder. Each repeat runs plain pack-tokens, then
--pack best-fit at --seq-len 2048 and 512 with the default --pack-window, one after the other
(interleaved, so a busy machine slows all three alike); the wall times are medians of child
processes (start-up included). Then the writers alone, in this process: the plain writer against the packed writer at several windows (the
packing's own cost, and padding against the window size). Goals: padding <= 1 % at 2048, extra wall
time <= 10 %.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKERS = 2


def run(corpus: Path, tokenizer: Path, out: Path, memory: str, *extra: str) -> tuple[float, dict]:
    cmd = [sys.executable, "-m", "shardsmith", "pack-tokens", str(corpus), "-o", str(out), "--tokenizer",
           str(tokenizer), "--workers", str(WORKERS), "--memory", memory, "--overwrite", "--quiet", *extra]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    return wall, json.loads((out / "manifest.json").read_text())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=50)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--memory", default="1GB")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/shardsmith-bench-pack"))
    args = ap.parse_args(argv)
    sys.path.insert(0, str(HERE))
    from corpus import write_corpus
    from harness import verdict
    from make_tokenizers import make_tokenizers

    work = args.workdir
    work.mkdir(parents=True, exist_ok=True)
    corpus = work / f"corpus-{args.mb:g}mb.jsonl"
    if not corpus.exists():
        write_corpus(corpus.with_suffix(".tmp"), args.mb)
        corpus.with_suffix(".tmp").rename(corpus)
    tokenizer = make_tokenizers(corpus, work / "tokenizers")["bpe"]
    variants = {"plain": (), "best-fit 2048": ("--pack", "best-fit", "--seq-len", "2048"),
                "best-fit 512": ("--pack", "best-fit", "--seq-len", "512")}
    walls: dict[str, list[float]] = {name: [] for name in variants}
    manifests: dict[str, dict] = {}
    for _ in range(args.repeat):
        for name, extra in variants.items():
            wall, manifests[name] = run(corpus, tokenizer, work / name.replace(" ", "-"), args.memory, *extra)
            walls[name].append(wall)
    plain = statistics.median(walls["plain"])
    print(f"bench_pack: {corpus.name} ({corpus.stat().st_size / 1e6:.1f} MB), {WORKERS} workers, --memory "
          f"{args.memory}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}, medians of {args.repeat}")
    print(f"{'variant':<15} {'wall s':>8} {'extra':>8} {'sequences':>10} {'padding':>9} {'docs split':>16} "
          f"{'window tokens':>14}")
    figures = {}
    for name in variants:
        wall = statistics.median(walls[name])
        p = manifests[name].get("packing") or {}
        docs = p.get("documents", sum(s["samples"] for s in manifests[name]["splits"].values()))
        extra = "" if name == "plain" else f"{100 * (wall / plain - 1):+.1f} %"
        split = f"{p['documents_split']:,} ({100 * p['split_fraction']:.2f} %)" if p else ""
        padding = f"{100 * p['padding_fraction']:.3f} %" if p else ""
        print(f"{name:<15} {wall:8.2f} {extra:>8} {p.get('sequences', ''):>10} {padding:>9} {split:>16} "
              f"{p.get('window_tokens', ''):>14}")
        figures[name] = {"wall_s": wall, "walls": walls[name], "documents": docs, **p}
    bf = figures["best-fit 2048"]
    verdict("issue 16: padding <= 1 % at --seq-len 2048", bf["padding_fraction"] <= 0.01,
            f"{100 * bf['padding_fraction']:.3f} %")
    verdict("issue 16: best-fit 2048 adds <= 10 % wall time", bf["wall_s"] <= 1.10 * plain,
            f"{100 * (bf['wall_s'] / plain - 1):+.1f} %")
    figures["writers"] = writers(work / "plain", work / "writers")
    print(json.dumps(figures))


def writers(plain: Path, scratch: Path) -> list[dict]:
    """The gather's own cost, in this process (less exposed to a busy machine than whole runs): the
    plain run's train documents through the plain writer and the packed writer at several windows,
    best of 3 each."""
    import shutil

    import numpy as np

    from shardsmith.formats.tokens.packed_writer import PackedTokensWriter
    from shardsmith.formats.tokens.writer import TokensWriter
    from shardsmith.loader import TokenDocuments

    docs = TokenDocuments(plain, split="train")
    lengths = docs.lengths
    tokens = np.concatenate([docs[i] for i in range(len(docs))]).astype(docs._shards.dtype)
    starts = np.concatenate([[0], np.cumsum(lengths)])
    rows = []
    for seq_len, window in ((0, 0), (2048, 1_000_000), (2048, 2_000_000), (2048, 4_000_000), (2048, 1 << 30),
                            (512, 1_000_000), (512, 4_000_000), (512, 1 << 30)):
        best = float("inf")
        for _ in range(3):
            shutil.rmtree(scratch, ignore_errors=True)
            scratch.mkdir(parents=True)
            kw = dict(out_dir=scratch, split="train", dtype=tokens.dtype, shard_tokens=1 << 30)
            w = (PackedTokensWriter(**kw, seq_len=seq_len, pad_id=0, window_tokens=window) if seq_len
                 else TokensWriter(**kw))
            t0 = time.perf_counter()
            for a in range(0, len(lengths), 4096):  # batches as the gather hands them over
                b = min(a + 4096, len(lengths))
                w.write_batch(lengths[a:b] * tokens.itemsize, memoryview(tokens[starts[a]:starts[b]]).cast("B"))
            w.close()
            best = min(best, time.perf_counter() - t0)
        extra = w.shards[0].extra
        pad = 1 - extra.get("real_tokens", extra["tokens"]) / extra["tokens"]
        rows.append({"seq_len": seq_len or None, "window_tokens": window or None, "seconds": round(best, 3),
                     "padding_fraction": round(pad, 6), "documents_split": extra.get("documents_split")})
        print(f"writer {'plain' if not seq_len else f'best-fit {seq_len}, window {window:,}':<32} "
              f"{best:6.3f} s for {len(tokens):,} tokens" + (f", padding {100 * pad:.3f} %" if seq_len else ""))
    shutil.rmtree(scratch, ignore_errors=True)
    return rows


if __name__ == "__main__":
    main()
