"""Near-duplicate removal against ground truth: shardsmith `pack-tokens --dedup minhash` beside
datatrove's four-stage MinHash pipeline, and the cost of `--dedup exact` and `--provenance` (issue 29).

    .venv/bin/python bench/bench_dedup.py --mb 1000 [--seed 0] [--keep] [--only datatrove,shardsmith,cost,decon]

The corpus is bench/planted.py's (10 % exact copies, some with changed case and whitespace; 10 % near
copies with word 5-gram Jaccard 0.7-0.95; a benchmark planted in 1 % of documents), in --files files,
made once per (--mb, --seed) under --workdir and reused with --keep.

Rows (one per tool): wall seconds and peak summed RSS of the process tree (sampled every 50 ms), the
documents removed, precision and recall against the planted copies and against brute-force Jaccard
on the first --sample-mb MB of the corpus (input order), and shardsmith's speed over datatrove's.

What counts (the same rule for both references and both tools; datatrove keeps one document of a
cluster chosen by union-by-size, shardsmith the first in input order, so a rule that asked for a
particular survivor would favour one of them):
  A reference partitions the documents into clusters of duplicates: for "planted", the original
  and every copy planted from it (exact, normalized-exact and near copies whatever their Jaccard;
  "R≥t" is the recall when only copies with Jaccard >= --threshold are joined, the others being
  singletons whose removal is then not counted either way); for "brute force", the connected
  components of the graph whose edges are the pairs of sample documents with Jaccard >= --threshold
  of their word 5-gram sets (normalized text, `textnorm.normalize`, split at spaces).
  A cluster of s documents calls for s - 1 removals. With r of its documents removed, min(r, s - 1)
  are true positives and max(0, r - (s - 1)) false positives (it removed every document of the
  cluster: one of them had to stay); a removed document alone in its cluster (no duplicate at all)
  is a false positive; s - 1 - min(r, s - 1) are misses (more than one of the cluster kept).
  precision = TP / removed, recall = TP / sum(s - 1). Against brute force only sample documents
  count (a pair of which one lies outside the sample is not in the reference).
Decontamination (`--decontaminate bench.jsonl`, its own run without dedup): recall and precision of
the removed documents against those whose normalized text shares a 13-word n-gram with a planted item.

Tools and options: shardsmith runs from --checkout (default: this repository) with the project's
interpreter, datatrove from --datatrove-python (its own venv, bench/dedup_datatrove.py); both with 5-grams
(--ngram), --bands x --rows permutations (default: shardsmith's MinHashSpec.for_threshold when the
checkout has it, else 9 x 13, datasketch's optimum for 0.8 and 128 permutations), 2 workers.
MB are 10**6 bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import planted  # noqa: E402
from bench_pack_tokens import run  # noqa: E402
from harness import key_figure  # noqa: E402

WORKERS = 2
DATATROVE_PY = "/work/bench-venvs/datatrove/bin/python"
DEDUP_RULES = ("exact", "exact:raw", "minhash")


# ---------------------------------------------------------------- ground truth and scoring

def union_find_labels(n: int, edges: np.ndarray) -> np.ndarray:
    """Connected-component label (its smallest member) of each of n nodes, for an (m, 2) edge array."""
    parent = np.arange(n)

    def find(x: int) -> int:
        root = x
        while parent[root] != root:
            root = parent[root]
        while parent[x] != root:
            parent[x], x = root, parent[x]
        return root

    for a, b in edges.tolist():
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    return np.array([find(i) for i in range(n)], dtype=np.int64)


def score(removed: np.ndarray, labels: np.ndarray, counted: np.ndarray | None = None) -> dict:
    """Cluster-based precision and recall (module docstring) of a boolean `removed` over documents
    labelled by cluster; documents with ``counted`` False are left out entirely."""
    if counted is not None:
        removed, labels = removed[counted], labels[counted]
    _, inv, size = np.unique(labels, return_inverse=True, return_counts=True)
    r = np.bincount(inv, weights=removed.astype(np.int64), minlength=len(size)).astype(np.int64)
    tp = int(np.minimum(r, size - 1).sum())
    n_removed, expected = int(removed.sum()), int((size - 1).sum())
    return {"removed": n_removed, "tp": tp, "fp": n_removed - tp, "fn": expected - tp, "expected": expected,
            "precision": tp / n_removed if n_removed else 1.0, "recall": tp / expected if expected else 1.0}


def planted_labels(truth: dict[str, np.ndarray], threshold: float | None = None) -> np.ndarray:
    """Clusters of the planted copies (each copy joined to its source), only copies with Jaccard >=
    threshold when one is given."""
    copy = truth["kind"] > 0
    if threshold is not None:
        copy &= truth["jaccard"] >= threshold
    idx = np.flatnonzero(copy)
    return union_find_labels(len(truth["kind"]), np.stack([idx, truth["source"][idx]], axis=1))


def brute_force_pairs(texts: list[str], threshold: float) -> np.ndarray:
    """Every pair (i, j, i < j) of texts whose word 5-gram sets have Jaccard >= threshold, exactly:
    prefix filtering (AllPairs) on an inverted index. Shingles are ordered rarest first; two sets with
    J >= t share one of the first |x| - ceil(t |x|) + 1 of each; candidates sharing a prefix shingle
    are checked exactly. Returns an (m, 3) array: i, j, Jaccard * 1e6 (int)."""
    per_doc = [np.unique(np.fromiter((hash(s) for s in planted.shingles(t)), dtype=np.int64)) for t in texts]
    allh = np.concatenate(per_doc)
    uniq, inv, counts = np.unique(allh, return_inverse=True, return_counts=True)
    order = np.lexsort((uniq, counts))  # rarest first
    rank = np.empty(len(uniq), dtype=np.int64)
    rank[order] = np.arange(len(uniq))
    toks, offs = [], np.cumsum([0] + [len(d) for d in per_doc])
    pref_tok, pref_doc = [], []
    for d in range(len(per_doc)):
        x = np.sort(rank[inv[offs[d]:offs[d + 1]]])
        toks.append(x)
        p = len(x) - int(np.ceil(threshold * len(x) - 1e-9)) + 1
        pref_tok.append(x[:p])
        pref_doc.append(np.full(min(p, len(x)), d, dtype=np.int64))
    pt, pd = np.concatenate(pref_tok), np.concatenate(pref_doc)
    s = np.argsort(pt, kind="stable")
    pt, pd = pt[s], pd[s]
    bounds = np.flatnonzero(np.diff(pt)) + 1
    cands: set[tuple[int, int]] = set()
    for group in np.split(pd, bounds):
        if len(group) > 1:
            g = np.unique(group).tolist()
            cands.update((a, b) for i, a in enumerate(g) for b in g[i + 1:])
    out = []
    for a, b in sorted(cands):
        inter = len(np.intersect1d(toks[a], toks[b], assume_unique=True))
        j = inter / (len(toks[a]) + len(toks[b]) - inter)
        if j >= threshold - 1e-12:
            out.append((a, b, int(round(j * 1e6))))
    return np.array(out, dtype=np.int64).reshape(-1, 3)


@dataclass
class Truth:
    meta: dict
    cols: dict[str, np.ndarray]
    threshold: float
    sample_n: int = 0  # documents of the brute-force sample (a prefix in input order)
    pairs: np.ndarray = field(default_factory=lambda: np.zeros((0, 3), np.int64))
    brute_s: float = 0.0

    @property
    def n(self) -> int:
        return len(self.cols["kind"])

    def index(self, file: str, line: int) -> int:
        if not hasattr(self, "_starts"):
            counts = np.bincount(self.cols["file_id"], minlength=len(self.meta["files"]))
            self._starts = dict(zip(self.meta["files"], np.concatenate([[0], np.cumsum(counts)[:-1]]).tolist()))
        return self._starts[os.path.basename(file)] + int(line)

    def evaluate(self, removed_idx: list[int] | np.ndarray) -> dict:
        removed = np.zeros(self.n, dtype=bool)
        removed[np.asarray(removed_idx, dtype=np.int64)] = True
        kind, jac = self.cols["kind"], self.cols["jaccard"]
        res = {"planted": score(removed, planted_labels(self.cols))}
        strict = planted_labels(self.cols, self.threshold)
        below = (kind == 3) & (jac < self.threshold)
        res["planted_ge_t"] = score(removed, strict, ~below)
        s = slice(0, self.sample_n)
        edges = self.pairs[:, :2]
        res["brute"] = score(removed[s], union_find_labels(self.sample_n, edges))
        # diagnostics: the share of each planted kind removed (whichever member of its cluster)
        res["removed_share"] = {
            "original": float(removed[kind == 0].mean()),
            "exact": float(removed[kind == 1].mean()) if (kind == 1).any() else None,
            "exact-normalized": float(removed[kind == 2].mean()) if (kind == 2).any() else None,
            "near J>=t": float(removed[(kind == 3) & ~below].mean()) if ((kind == 3) & ~below).any() else None,
            "near J<t": float(removed[below].mean()) if below.any() else None}
        return res


def load_truth(root: Path, threshold: float, sample_mb: float) -> Truth:
    meta, cols = planted.load_truth(root)
    t = Truth(meta, cols, threshold)
    t.sample_n = int(np.searchsorted(np.cumsum(cols["nbytes"]), sample_mb * 1e6) + 1)
    t.sample_n = min(t.sample_n, t.n)
    cache = root / f"brute-{threshold}-{t.sample_n}.npy"
    if cache.exists():
        t.pairs = np.load(cache)
        return t
    texts, left = [], t.sample_n
    for name in meta["files"]:
        with open(root / "corpus" / name, "rb") as f:
            for line in f:
                if left == 0:
                    break
                texts.append(json.loads(line)["text"])
                left -= 1
    t0 = time.perf_counter()
    t.pairs = brute_force_pairs(texts, threshold)
    t.brute_s = time.perf_counter() - t0
    np.save(cache, t.pairs)
    return t


# ---------------------------------------------------------------- the tools

@dataclass
class Outcome:
    tool: str
    wall: float | None = None
    peak_mb: float | None = None
    removed: list[int] | None = None
    note: str = ""
    extra: dict = field(default_factory=dict)


def parse_removed(path: Path, truth: Truth) -> dict[str, list]:
    """shardsmith's --removed JSONL, by rule: the global indexes of the removed documents; for
    "decontaminate", (index, item) pairs; "duplicate_of" is kept under "pairs" (index, kept index)."""
    out: dict[str, list] = {"pairs": []}
    for raw in path.read_text().splitlines():
        if not raw.strip():
            continue
        e = json.loads(raw)
        i = truth.index(e["file"], e["record"])
        rule = e["rule"]
        if rule == "decontaminate":
            out.setdefault(rule, []).append((i, e.get("item")))
            continue
        out.setdefault(rule, []).append(i)
        if e.get("duplicate_of"):
            d = e["duplicate_of"]
            out["pairs"].append((i, truth.index(d["file"], d["record"])))
    return out


def peak_mb(res) -> float:
    return max(res.maxrss_mb, res.tree_rss_mb) * 2**20 / 1e6


def run_datatrove(args, root: Path, truth: Truth, work: Path) -> Outcome:
    o = Outcome(f"datatrove MinHash, 4 stages, {WORKERS} tasks")
    if not Path(args.datatrove_python).exists():
        o.note = f"not installed ({args.datatrove_python})"
        return o
    out = work / "datatrove"
    shutil.rmtree(out, ignore_errors=True)
    res = run([args.datatrove_python, str(HERE / "dedup_datatrove.py"), str(root / "corpus"), str(out),
               "--ngram", str(args.ngram), "--bands", str(args.bands), "--rows", str(args.rows),
               "--tasks", str(WORKERS)], work / "datatrove.log", env={"PYTHONWARNINGS": "ignore"})
    rep = json.loads(res.out.strip().splitlines()[-1])
    o.wall, o.peak_mb = res.wall, peak_mb(res)
    o.removed = [truth.index(f, line) for f, line in rep["removed"]]
    o.extra = {"version": rep["version"], "stage_seconds": rep["seconds"]}
    o.note = "datatrove " + rep["version"] + ": " + ", ".join(f"{k} {v:.1f}" for k, v in rep["seconds"].items())
    return o


class Shardsmith:
    def __init__(self, args, root: Path, work: Path):
        self.args, self.root, self.work = args, root, work
        self.env = {"PYTHONPATH": str(args.checkout), "PYTHONWARNINGS": "ignore"}
        self.help = subprocess.run([sys.executable, "-P", "-m", "shardsmith", "pack-tokens", "--help"], capture_output=True,
                                   text=True, env={**os.environ, **self.env}).stdout
        self.tokenizer = root / "bpe.json"
        if not self.tokenizer.exists():
            subprocess.run([sys.executable, str(HERE / "make_tokenizers.py"), str(root / "corpus" / "part-00000.jsonl"),
                            "-o", str(root)], check=True, env={**os.environ, **self.env}, capture_output=True)

    def supports(self, *words: str) -> bool:
        return all(w in self.help for w in words)

    def pack(self, name: str, *extra: str) -> tuple[object, Path, Path]:
        out, removed = self.work / f"ss-{name}", self.work / f"ss-{name}.removed.jsonl"
        shutil.rmtree(out, ignore_errors=True)
        removed.unlink(missing_ok=True)
        cmd = [sys.executable, "-P", "-m", "shardsmith", "pack-tokens", str(self.root / "corpus"), "-o", str(out),
               "--tokenizer", str(self.tokenizer), "--workers", str(WORKERS), "--quiet", *extra]
        if any(x.startswith("--dedup") or x.startswith("--decontaminate") for x in extra):
            cmd += ["--removed", str(removed)]
        return run(cmd, self.work / f"ss-{name}.log", env=self.env), out, removed


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def run_shardsmith(ss: Shardsmith, args, truth: Truth) -> Outcome:
    o = Outcome(f"shardsmith pack-tokens --dedup minhash, {WORKERS} workers")
    if not ss.supports("--dedup", "minhash", "--removed"):
        o.note = "this checkout's pack-tokens has no --dedup minhash / --removed"
        return o
    extra = ["--dedup", "minhash", "--dedup-threshold", str(args.threshold)]
    try:
        res, _, removed = ss.pack("minhash", *extra)
    except RuntimeError as e:
        o.note = "failed: " + str(e).splitlines()[-1][:200]
        return o
    o.wall, o.peak_mb = res.wall, peak_mb(res)
    if ss.tokenize_wall is None:  # the same pack-tokens without --dedup: what dedup itself costs
        ss.tokenize_wall = ss.pack("tokenize-only")[0].wall
    by_rule = parse_removed(removed, truth)
    o.removed = sorted(set(by_rule.get("minhash", []) + by_rule.get("exact", [])))
    o.extra = {"rules": {k: len(v) for k, v in by_rule.items()}}
    if ss.tokenize_wall:
        o.extra["dedup_s"] = res.wall - ss.tokenize_wall
        o.note = f"dedup itself {res.wall - ss.tokenize_wall:.1f} s over tokenize-only {ss.tokenize_wall:.1f} s"
    return o


def cost_section(ss: Shardsmith, args) -> dict:
    """pack-tokens alone, with --dedup exact, with --provenance: wall time and output bytes, and ratios."""
    variants = {"tokenize only": [], "--dedup exact": ["--dedup", "exact"], "--provenance": ["--provenance"]}
    rows: dict[str, dict] = {}
    for _ in range(args.repeat):  # interleaved
        for name, extra in variants.items():
            if extra and not ss.supports(extra[0]):
                rows[name] = {"note": f"this checkout's pack-tokens has no {extra[0]}"}
                continue
            res, out, _ = ss.pack(name.strip("-").replace(" ", "-"), *extra)
            r = rows.setdefault(name, {"walls": [], "peak_mb": 0.0})
            r["walls"].append(res.wall)
            r["peak_mb"] = max(r["peak_mb"], peak_mb(res))
            r["bytes"] = dir_bytes(out)
    base = rows["tokenize only"]
    base["wall"] = float(np.median(base["walls"]))
    print(f"\npack-tokens cost of cleaning ({truth_size(ss.root):.1f} MB, {WORKERS} workers, median of {args.repeat}):")
    print(f"  {'variant':<16} {'wall s':>7} {'ratio':>6} {'out MB':>8} {'ratio':>7} {'peak MB':>8}")
    for name, r in rows.items():
        if "walls" not in r:
            print(f"  {name:<16} {r['note']}")
            continue
        r["wall"] = float(np.median(r["walls"]))
        r["wall_ratio"], r["bytes_ratio"] = r["wall"] / base["wall"], r["bytes"] / base["bytes"]
        print(f"  {name:<16} {r['wall']:>7.2f} {r['wall_ratio']:>6.3f} {r['bytes'] / 1e6:>8.2f}"
              f" {r['bytes_ratio']:>7.4f} {r['peak_mb']:>8.0f}")
    ss.tokenize_wall = base["wall"]
    key_figure("cost of cleaning", ", ".join(f"{name} {r['wall_ratio']:.2f}x" for name, r in rows.items()
                                             if "wall_ratio" in r and r is not base) + " the tokenize-only wall")
    return rows


def decon_section(ss: Shardsmith, truth: Truth) -> dict:
    if not ss.supports("--decontaminate"):
        print("\n--decontaminate: this checkout's pack-tokens has no such option")
        return {"note": "not available"}
    try:
        res, _, removed = ss.pack("decontaminate", "--decontaminate", str(ss.root / "bench.jsonl"))
    except RuntimeError as e:
        print(f"\n--decontaminate failed: {str(e).splitlines()[-1][:200]}")
        return {"note": "failed"}
    got = dict(parse_removed(removed, truth).get("decontaminate", []))
    want = {i: int(k) for i, k in enumerate(truth.cols["item"]) if k >= 0}
    tp = len(set(got) & set(want))
    both = [i for i in set(got) & set(want) if got[i] is not None]
    # the item is named by its 0-based index or by its 1-based line in the file: count both, say which
    item_ok, base = max((sum(got[i] == want[i] + b for i in both), b) for b in (0, 1))
    r = {"wall": res.wall, "removed": len(got), "contaminated": len(want), "tp": tp,
         "recall": tp / len(want) if want else 1.0, "precision": tp / len(got) if got else 1.0, "item_matches": item_ok,
         "item_base": base}
    key_figure("--decontaminate", f"recall {r['recall']:.3f}, precision {r['precision']:.3f}")
    print(f"\n--decontaminate bench.jsonl ({truth.meta['items']} items, planted in {len(want)} documents): "
          f"removed {len(got)}, recall {r['recall']:.4f}, precision {r['precision']:.4f}, "
          f"right item named {item_ok}/{tp} (as its {'1-based line' if base else '0-based index'}), wall {res.wall:.1f} s")
    return r


def truth_size(root: Path) -> float:
    return json.loads((root / "truth.json").read_text())["bytes"] / 1e6


def default_bands(checkout: Path, threshold: float) -> tuple[int, int, str]:
    """shardsmith's (bands, rows) for the threshold, from MinHashSpec.for_threshold if the checkout has it."""
    code = (f"from shardsmith.text.minhash import MinHashSpec as M; s = M.for_threshold({threshold!r}, seed=0); "
            "print(getattr(s, 'bands', None), getattr(s, 'rows', None))")
    p = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(checkout)})
    try:
        b, r = (int(x) for x in p.stdout.split())
        return b, r, "shardsmith's MinHashSpec.for_threshold"
    except ValueError:
        return 9, 13, "default: datasketch's optimum for 0.8 and 128 permutations; the checkout has no MinHashSpec)"


def selftest() -> None:
    """The scoring and the brute force on hand-made cases whose answers are known."""
    # clusters {0,1,2}, {3,4}, {5}, {6}: 3 removals expected
    labels = np.array([0, 0, 0, 3, 3, 5, 6])
    r = score(np.array([0, 1, 1, 0, 0, 0, 0], bool), labels)  # 2 right, one of {3,4} missed
    assert (r["tp"], r["fp"], r["fn"]) == (2, 0, 1), r
    r = score(np.array([1, 1, 1, 0, 1, 1, 0], bool), labels)  # all of {0,1,2}: one too many; 5 alone
    assert (r["tp"], r["fp"], r["fn"]) == (3, 2, 0) and r["precision"] == 0.6 and r["recall"] == 1.0, r
    r = score(np.array([1, 0, 0, 1, 0, 0, 0], bool), labels)  # the first of each kept or not: same score
    assert (r["tp"], r["fp"], r["fn"]) == (2, 0, 1), r
    assert union_find_labels(6, np.array([[4, 1], [1, 3], [5, 2]])).tolist() == [0, 1, 2, 1, 1, 2]
    words = [f"w{i}" for i in range(40)]
    a = " ".join(words)                                   # 36 shingles
    b = " ".join(words[:39] + ["x"])                      # 35 shared of 37: J 0.946
    c = " ".join(words[:20] + ["y"] + words[21:])         # 31 shared of 41: J 0.756
    d = " ".join(f"v{i}" for i in range(40))             # nothing shared
    e = "  ".join(words).upper()                          # a, normalized: J 1
    pairs = brute_force_pairs([a, b, c, d, e], 0.8)
    assert pairs[:, :2].tolist() == [[0, 1], [0, 4], [1, 4]], pairs
    assert abs(pairs[0, 2] / 1e6 - 35 / 37) < 1e-6
    assert brute_force_pairs([a, c], 0.75)[:, :2].tolist() == [[0, 1]]
    print("selftest: scoring and brute force agree with the hand-made answers")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=1000, help="corpus size in MB (20-50 while developing)")
    ap.add_argument("--seed", type=int, default=0, help="corpus seed")
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/shardsmith-bench/dedup"))
    ap.add_argument("--keep", action="store_true", help="keep the corpus folder (and reuse it next time)")
    ap.add_argument("--only", default="datatrove,shardsmith,cost,decon",
                    help="comma-separated: datatrove, shardsmith, cost, decon")
    ap.add_argument("--threshold", type=float, default=0.8)
    ap.add_argument("--ngram", type=int, default=5)
    ap.add_argument("--bands", type=int, default=None)
    ap.add_argument("--rows", type=int, default=None)
    ap.add_argument("--sample-mb", type=float, default=20, help="brute-force Jaccard sample (prefix of the corpus)")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each cost row (median)")
    ap.add_argument("--checkout", type=Path, default=HERE.parent, help="the shardsmith checkout to run")
    ap.add_argument("--datatrove-python", default=DATATROVE_PY)
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    ap.add_argument("--selftest", action="store_true", help="check the scoring on hand-made cases, then exit")
    args = ap.parse_args(argv)
    if args.selftest:
        selftest()
        return
    only = set(args.only.split(","))
    bands, rows, why = default_bands(args.checkout, args.threshold)
    args.bands, args.rows = args.bands or bands, args.rows or rows
    if args.ngram != planted.NGRAM:
        print(f"note: the references use word {planted.NGRAM}-grams; the tools run with {args.ngram}-grams")
    root = args.workdir / f"planted-{args.mb:g}mb-s{args.seed}-f{args.files}"
    work = args.workdir / "runs"
    work.mkdir(parents=True, exist_ok=True)
    print(f"bench_dedup: load {os.getloadavg()[0]:.2f}, {os.cpu_count()} cores; bands x rows {args.bands} x "
          f"{args.rows} ({why}), {args.ngram}-grams, threshold {args.threshold}")
    t0 = time.perf_counter()
    if not (root / "truth.json").exists():
        shutil.rmtree(root, ignore_errors=True)
        planted.generate(root, args.mb, args.seed, args.files)
        print(f"corpus generated in {time.perf_counter() - t0:.1f} s: {root}")
    truth = load_truth(root, args.threshold, args.sample_mb)
    m = truth.meta
    print(f"corpus {m['bytes'] / 1e6:.1f} MB, {m['documents']} documents ({m['mean_doc_bytes']:.0f} B mean), "
          f"{m['kinds']}, near-copy J {m['near_jaccard']['min']:.3f}-{m['near_jaccard']['max']:.3f}; brute force on "
          f"the first {truth.sample_n} documents: {len(truth.pairs)} pairs with J >= {args.threshold}"
          + (f" ({truth.brute_s:.1f} s)" if truth.brute_s else " (cached)"))

    results: dict = {"mb": m["bytes"] / 1e6, "documents": m["documents"], "seed": args.seed, "bands": args.bands,
                     "rows": args.rows, "ngram": args.ngram, "threshold": args.threshold, "sample_docs": truth.sample_n,
                     "brute_pairs": len(truth.pairs), "date": time.strftime("%Y-%m-%d"), "tools": {}}
    ss = None
    if only & {"shardsmith", "cost", "decon"}:
        ss = Shardsmith(args, root, work)
        ss.tokenize_wall = None
    if "cost" in only:
        results["cost"] = cost_section(ss, args)
    if "decon" in only:
        results["decontaminate"] = decon_section(ss, truth)
    outcomes = []
    if "datatrove" in only:
        outcomes.append(run_datatrove(args, root, truth, work))
    if "shardsmith" in only:
        outcomes.append(run_shardsmith(ss, args, truth))
    dt_wall = next((o.wall for o in outcomes if o.tool.startswith("datatrove") and o.wall), None)
    print(f"\nnear-duplicate removal, {m['bytes'] / 1e6:.1f} MB, threshold {args.threshold}, {args.bands} x {args.rows}, "
          f"{args.ngram}-grams; P/R: precision/recall (cluster rule in the docstring); planted R>=t: only copies "
          f"with J >= t; brute force: first {truth.sample_n} documents")
    print(f"{'tool':<44} {'wall s':>7} {'peak MB':>8} {'removed':>8} {'P plant':>8} {'R plant':>8} {'R>=t':>7}"
          f" {'P brute':>8} {'R brute':>8} {'speed':>6}")
    for o in outcomes:
        if o.removed is None:
            print(f"{o.tool:<44} {o.note}")
            results["tools"][o.tool] = {"note": o.note}
            continue
        ev = truth.evaluate(o.removed)
        speed = f"{dt_wall / o.wall:.2f}x" if dt_wall and o.wall else ""
        print(f"{o.tool:<44} {o.wall:>7.1f} {o.peak_mb:>8.0f} {len(o.removed):>8} {ev['planted']['precision']:>8.4f}"
              f" {ev['planted']['recall']:>8.4f} {ev['planted_ge_t']['recall']:>7.4f} {ev['brute']['precision']:>8.4f}"
              f" {ev['brute']['recall']:>8.4f} {speed:>6}")
        if o.note:
            print(f"{'':<4}{o.note}")
        share = ", ".join(f"{k} {v:.3f}" for k, v in ev["removed_share"].items() if v is not None)
        print(f"{'':<4}share removed by planted kind: {share}")
        key_figure(o.tool, f"precision {ev['planted']['precision']:.3f}, recall {ev['planted']['recall']:.3f} (planted); "
                   + (f"{dt_wall / o.wall:.2f}x datatrove's speed" if dt_wall and o.wall else f"{o.wall:.1f} s"))
        results["tools"][o.tool] = {"wall": o.wall, "peak_mb": o.peak_mb, "removed": len(o.removed), **ev, **o.extra,
                                    "speed_vs_datatrove": (dt_wall / o.wall) if dt_wall and o.wall else None}
    print(f"load at end {os.getloadavg()[0]:.2f}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
