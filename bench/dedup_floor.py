"""Single-core cost of --dedup exact's per-document work, step by step (issue 29's floor).

    .venv/bin/python bench/dedup_floor.py /tmp/bd1g/planted-1000mb-s0-f8/corpus/part-00000.jsonl

Reads the first 50 MB of documents of a JSONL file (bench/planted.py's corpus) and times, best of 3,
each step on the same documents: textnorm.normalize and its parts, blake2b, doc_hashes, and the
batch path (text/textnorm_batch.py, batches of 2,048 documents as the scatter reads them) against it.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import unicodedata
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from shardsmith.text.textnorm import _SPACES, doc_hashes, normalize  # noqa: E402


def load(path: str, limit: float = 50e6) -> list[str]:
    docs, size = [], 0
    with open(path, "rb") as fh:
        for line in fh:
            docs.append(json.loads(line)["text"])
            size += len(line)
            if size > limit:
                break
    return docs


def main() -> None:
    docs = load(sys.argv[1])
    mb = sum(len(d.encode()) for d in docs) / 1e6

    def rate(name: str, f: Callable[[], object]) -> None:
        best = 0.0
        for _ in range(3):
            t = time.perf_counter()
            f()
            best = max(best, mb / (time.perf_counter() - t))
        print(f"  {name:<34} {best:7.0f} MB/s")

    beyond = sum(bool(d) and max(map(ord, d)) > 0xFFFF for d in docs) / len(docs)
    print(f"{len(docs)} documents, {mb:.1f} MB; ASCII-only {sum(d.isascii() for d in docs) / len(docs):.1%}, "
          f"with a character beyond the BMP {beyond:.1%}")
    folded = [d.casefold() for d in docs]
    rate("normalize", lambda: [normalize(d) for d in docs])
    rate("  str.casefold", lambda: [d.casefold() for d in docs])
    rate("  NFKC quick check", lambda: [unicodedata.is_normalized("NFKC", d) for d in docs])
    rate("  13 space checks (folded text)", lambda: [[c in t for c in _SPACES] for t in folded])
    rate("  '  ' in text (folded text)", lambda: ["  " in t for t in folded])
    rate("blake2b-128 of the UTF-8", lambda: [hashlib.blake2b(d.encode(), digest_size=16).digest() for d in docs])
    rate("doc_hashes (normalize + hash)", lambda: doc_hashes(docs))
    rate("doc_hashes raw", lambda: doc_hashes(docs, raw=True))
    plain = [d.encode("ascii", "ignore").decode() for d in docs]
    rate("normalize, non-ASCII removed", lambda: [normalize(d) for d in plain])
    try:
        from shardsmith.text import textnorm_batch as tb
    except ImportError:
        return
    tb.warm()
    batches = [docs[i:i + 2048] for i in range(0, len(docs), 2048)]
    assert all(list(tb.normalize_batch(b)) == [normalize(d) for d in b] for b in batches[:2])
    rate("normalize_batch (2,048 a batch)", lambda: [tb.normalize_batch(b) for b in batches])
    rate("  ... and decoded to str", lambda: [tb.normalize_batch(b).texts() for b in batches])
    rate("normalize_batch + hash", lambda: [tb.doc_hashes(tb.normalize_batch(b)) for b in batches])
    plain_batches = [plain[i:i + 2048] for i in range(0, len(plain), 2048)]
    rate("normalize_batch, non-ASCII removed", lambda: [tb.normalize_batch(b) for b in plain_batches])


if __name__ == "__main__":
    main()
