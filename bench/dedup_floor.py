"""Single-core cost of --dedup exact's per-document work, step by step (issue 29's floor).

    .venv/bin/python bench/dedup_floor.py /tmp/bd1g/planted-1000mb-s0-f8/corpus/part-00000.jsonl

Reads the first 50 MB of documents of a JSONL file (bench/planted.py's corpus) and times, best of 3,
each step on the same documents: textnorm.normalize, its parts, blake2b, doc_hashes.
"""
import hashlib
import json
import os
import sys
import time
import unicodedata

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from shardsmith.kit.textnorm import _SPACES, doc_hashes, normalize  # noqa: E402

docs, size = [], 0
with open(sys.argv[1], "rb") as fh:
    for line in fh:
        docs.append(json.loads(line)["text"]); size += len(line)
        if size > 50e6: break
mb = sum(len(d.encode()) for d in docs) / 1e6
ascii_share = sum(d.isascii() for d in docs) / len(docs)
def rate(f):
    best = 0
    for _ in range(3):
        t = time.perf_counter(); f(); best = max(best, mb / (time.perf_counter() - t))
    return best
print(f"{len(docs)} docs, {mb:.1f} MB, ASCII-only docs {ascii_share:.1%}")
print("normalize                 %.0f MB/s" % rate(lambda: [normalize(d) for d in docs]))
print("  casefold alone          %.0f MB/s" % rate(lambda: [d.casefold() for d in docs]))
print("  NFKC quick check alone  %.0f MB/s" % rate(lambda: [unicodedata.is_normalized("NFKC", d) for d in docs]))
print("blake2b-128 of UTF-8      %.0f MB/s" % rate(lambda: [hashlib.blake2b(d.encode(), digest_size=16).digest() for d in docs]))
print("doc_hashes (normalize+hash) %.0f MB/s" % rate(lambda: doc_hashes(docs)))
print("doc_hashes raw            %.0f MB/s" % rate(lambda: doc_hashes(docs, raw=True)))
asc = [d.encode("ascii", "ignore").decode() for d in docs]
print("normalize, same docs made ASCII %.0f MB/s" % rate(lambda: [normalize(d) for d in asc]))
cf = [d.casefold() for d in docs]
print("13 space checks          %.0f MB/s" % rate(lambda: [[c in t for c in _SPACES] for t in cf]))
print("'  ' in t                %.0f MB/s" % rate(lambda: ["  " in t for t in cf]))
print("t.replace('\\n',' ')      %.0f MB/s" % rate(lambda: [t.replace("\n", " ") for t in cf]))
print("strip                    %.0f MB/s" % rate(lambda: [t.strip(" ") for t in cf]))
print(f"documents with a character beyond the BMP: {sum(max(map(ord, d)) > 0xFFFF for d in docs if d) / len(docs):.1%}")
