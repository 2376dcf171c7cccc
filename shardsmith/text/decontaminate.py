"""``--decontaminate FILE``: the word n-grams of benchmark items, and which documents share one.

A benchmark file is JSONL (``.jsonl``, ``.json``: the item's text is ``--decontaminate-field``) or
plain text (one item a line); blank lines are not items, and a UTF-8 byte order mark at the start
of a file is not text of its first item (the file is read whole: a regular file of at most
``core/side_file.BENCHMARK_LIMIT``). Items and documents go through the one
normalization (``text/textnorm.py``) and the same word n-gram hashes (``text/ngrams.py``): a
document that shares any n-gram (13 words by default) with an item is contaminated by it. An item
shorter than n words is matched whole: its word sequence anywhere in the document. Every n-gram of
every item is kept (a sorted array of 64-bit hashes, not a Bloom filter), so nothing is missed
for want of bits, and a false match needs a 64-bit hash collision.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson

from shardsmith.core.side_file import BENCHMARK_LIMIT, read_side_file
from shardsmith.errors import UsageError
from shardsmith.text.ngrams import word_ngram_hashes
from shardsmith.text.textnorm import normalize

JSON_SUFFIXES = (".jsonl", ".json", ".ndjson")
UTF8_BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True)
class _Table:
    """Sorted n-gram hashes and, for each, the first item (in file and line order) that has it."""

    hashes: np.ndarray
    items: np.ndarray

    @classmethod
    def of(cls, hashes: np.ndarray, items: np.ndarray) -> _Table:
        perm = np.lexsort((items, hashes))
        hashes, items = hashes[perm], items[perm]
        first = np.ones(len(hashes), bool)
        first[1:] = hashes[1:] != hashes[:-1]
        return cls(hashes=hashes[first], items=items[first])

    def lookup(self, hashes: np.ndarray) -> np.ndarray:
        """The item of each hash, or -1."""
        if not len(self.hashes) or not len(hashes):
            return np.full(len(hashes), -1, dtype=np.int64)
        at = np.searchsorted(self.hashes, hashes).clip(max=len(self.hashes) - 1)
        return np.where(self.hashes[at] == hashes, self.items[at], -1)


class Benchmarks:
    """Every item of the benchmark files: where it is (file, line) and its n-grams."""

    def __init__(self, *, names: list[str], lines: np.ndarray, files: np.ndarray, ngram: int,
                 tables: dict[int, _Table], words: np.ndarray | None = None) -> None:
        self.names = names  # the files as given
        self.lines = lines  # per item: its 1-based line in its file
        self.files = files  # per item: index into names
        self.ngram = ngram
        self.tables = tables  # words per n-gram -> table (ngram; shorter lengths: items matched whole)
        self.words = np.zeros(len(lines), np.int64) if words is None else words  # per item: its words

    def fewer_than(self, words: int) -> list[tuple[str, int]]:
        """(file, line) of the items of fewer than ``words`` words (and at least one), which match
        wherever those few words appear in a document."""
        return [self.item(i) for i in np.flatnonzero((self.words > 0) & (self.words < words)).tolist()]

    @classmethod
    def load(cls, paths: Sequence[str], *, ngram: int, field: str = "text") -> Benchmarks:
        texts: list[str] = []
        lines: list[int] = []
        files: list[int] = []
        for f, path in enumerate(paths):
            for line, text in _items(Path(path), field):
                texts.append(normalize(text))
                lines.append(line)
                files.append(f)
        hashes, offsets = word_ngram_hashes(texts, ngram, normalized=True)
        counts = np.diff(offsets)
        item_of = np.repeat(np.arange(len(texts), dtype=np.int64), counts)
        words = np.fromiter((t.count(" ") + 1 if t else 0 for t in texts), dtype=np.int64, count=len(texts))
        short = (words < ngram)[item_of]
        tables = {ngram: _Table.of(hashes[~short], item_of[~short])}
        for k in np.unique(words[(words > 0) & (words < ngram)]).tolist():
            at = short & (words[item_of] == k)
            tables[int(k)] = _Table.of(hashes[at], item_of[at])
        return cls(names=list(paths), lines=np.asarray(lines, np.int64), files=np.asarray(files, np.int64),
                   ngram=ngram, tables=tables, words=words)

    def count(self, name: str) -> int:
        """Items of the benchmark file ``name``."""
        return int((self.files == self.names.index(name)).sum())

    def item(self, index: int) -> tuple[str, int]:
        """(file as given, 1-based line) of item ``index``."""
        return self.names[int(self.files[index])], int(self.lines[index])

    def match(self, texts: Sequence[str], *, normalized: bool = False) -> np.ndarray:
        """Per text (``normalized``: already), the first item (in input order of the benchmark files) it
        shares an n-gram with, or -1."""
        normal = list(texts) if normalized else [normalize(t) for t in texts]
        found = np.full(len(texts), np.iinfo(np.int64).max, dtype=np.int64)
        for k, table in self.tables.items():
            if not len(table.hashes):
                continue
            hashes, offsets = word_ngram_hashes(normal, k, normalized=True)
            items = table.lookup(hashes)
            hit = items >= 0
            if hit.any():
                doc = np.repeat(np.arange(len(texts), dtype=np.int64), np.diff(offsets))
                np.minimum.at(found, doc[hit], items[hit])
        return np.where(found == np.iinfo(np.int64).max, -1, found)


def _items(path: Path, field: str) -> list[tuple[int, str]]:
    """(1-based line, text) of every item of a benchmark file; a broken one is a one-line error."""
    data = read_side_file(path, what="--decontaminate", limit=BENCHMARK_LIMIT)
    data = data.removeprefix(UTF8_BOM)  # an editor's byte order mark is no part of the first item
    json_lines = path.suffix.lower() in JSON_SUFFIXES
    out = []
    for n, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        if not json_lines:
            try:
                out.append((n, raw.decode("utf-8")))
            except UnicodeDecodeError:
                raise UsageError(f"--decontaminate {path}:{n}: not UTF-8 text") from None
            continue
        try:
            value = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise UsageError(f"--decontaminate {path}:{n}: not a JSON object") from None
        text = value.get(field) if isinstance(value, dict) else None
        if not isinstance(text, str):
            raise UsageError(f"--decontaminate {path}:{n}: no string {field!r} field (--decontaminate-field names it)")
        out.append((n, text))
    return out
