"""What a text run is asked to clean and trace (``--dedup``, ``--decontaminate``, ``--provenance``),
and what a scatter worker computes of each document for it (``Cleaner``).

Decontamination is decided per document, in the worker, as it is read: a document is dropped
there. Dedup needs every document first: the worker records each kept document's key for its
rule (``doc_columns``: a 128-bit hash of the normalized or raw text, or MinHash band keys), and
the engine decides between the scatter and the gather which ones go (``engine/shuffle/duplicates.py``):
the first in input order of each set of duplicates stays, whatever the workers, memory or stages.

How a run goes: a processor whose records are documents hands the scatter each good record's text
(``Processed.texts``). A benchmark match (``text/decontaminate.py``: every word n-gram of every
item, as sorted 64-bit hashes) is dropped in the worker and counted per benchmark file in the
task's result. For dedup and ``--provenance`` each scatter task writes its documents' facts beside
its part file before the part is renamed (``engine/shuffle/doc_facts.py``: input order, (split, bucket),
length; the 128-bit hash of the normalized text, ``text/textnorm.py``, or MinHash band keys;
origins). The decision (``engine/shuffle/duplicates.py``) is saved once (``duplicates.npy``); every gather
rank and the finalize read or make the same rows, and ``SplitGather`` leaves them out of each
bucket group (``buckets.in_output_order``), so counts, plans and shards are those of the kept
documents only. ``engine/shuffle/cleaned.py`` writes the manifest's ``cleaning`` record and the
``--removed`` list. Into S3 stages the facts travel through the bucket with the parts.

This module is the engine's one way into ``shardsmith.text`` (docs/design.md, "Layers"): the engine
holds a ``CleaningSpec``, builds its workers' ``Cleaner`` from it and asks it for the MinHash
decision (``CleaningSpec.near_duplicates``), and never imports the rest of the package.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from shardsmith.core.words import plural
from shardsmith.errors import UsageError
from shardsmith.text import textnorm, textnorm_batch

DEDUP_MODES = ("exact", "exact:raw", "minhash")
# MinHash's permutations are seeded by a constant, not by --seed: a new shuffle seed reorders the
# documents but drops the same ones (as splits ignore the seed)
MINHASH_SEED = 0
SHORT_ITEM_WORDS = 4  # benchmark items shorter than this are said before the run (they match almost anywhere)


@dataclass(frozen=True, kw_only=True)
class CleaningSpec:
    """The cleaning a run does; ``units`` names what a payload's length counts (tokens, bytes)."""

    dedup: str | None = None
    threshold: float = 0.8
    benchmarks: tuple[str, ...] = ()
    ngram: int = 13
    benchmark_field: str = "text"
    provenance: bool = False
    units: str = "tokens"

    @classmethod
    def of(cls, opts: Any, *, units: str) -> CleaningSpec | None:
        """The spec ``opts`` ask for (None: no cleaning, no provenance), checked."""
        spec = cls(dedup=opts.dedup, threshold=opts.dedup_threshold, benchmarks=tuple(opts.decontaminate),
                   ngram=opts.decontaminate_ngram, benchmark_field=opts.decontaminate_field,
                   provenance=bool(getattr(opts, "provenance", False)), units=units)
        spec.check()
        return spec if (spec.dedup or spec.benchmarks or spec.provenance) else None

    def check(self) -> None:
        if self.dedup is not None and self.dedup not in DEDUP_MODES:
            raise UsageError(f"--dedup {self.dedup!r}: give one of {', '.join(DEDUP_MODES)}")
        if not (math.isfinite(self.threshold) and 0 < self.threshold < 1):
            raise UsageError(f"--dedup-threshold {self.threshold}: give a Jaccard similarity between 0 and 1")
        if not 1 <= self.ngram <= 1000:
            raise UsageError(f"--decontaminate-ngram {self.ngram}: give a number of words from 1 to 1000")

    @property
    def exact(self) -> bool:
        return self.dedup in ("exact", "exact:raw")

    def minhash(self) -> Any:
        """The ``text.minhash.MinHashSpec`` of ``--dedup minhash`` (None for the other rules)."""
        if self.dedup != "minhash":
            return None
        from shardsmith.text.minhash import MinHashSpec

        return MinHashSpec.for_threshold(self.threshold, seed=MINHASH_SEED)

    def near_duplicates(self, bands: Callable[[], Iterable[np.ndarray]], n_docs: int, *, memory: int,
                        tmp_dir: str | Path) -> np.ndarray:
        """Per document, the first (in input order) of its MinHash cluster (``text.minhash.near_duplicates``
        under this spec's ``--dedup minhash``): the gather-side decision, the engine's one way into it."""
        from shardsmith.text.minhash import near_duplicates

        return near_duplicates(bands, n_docs, self.minhash(), memory=memory, tmp_dir=tmp_dir)

    def columns(self) -> tuple[str, ...]:
        """The per-document facts the scatter records (``engine/shuffle/doc_facts.py``)."""
        return ("base", *(("hash",) if self.exact else ()), *(("bands",) if self.dedup == "minhash" else ()),
                *(("origin",) if self.provenance else ()))


class Cleaner:
    """The worker's side of a spec: which documents a benchmark contaminates, and each document's
    dedup key. Picklable; what it loads (the benchmarks' n-grams) is loaded once per process."""

    def __init__(self, *, spec: CleaningSpec) -> None:
        self.spec = spec
        self._benchmarks: Any = None
        self.minhash = spec.minhash()
        if self.compares_normalized:  # built here, before the workers fork, not once in each of them
            textnorm_batch.warm()

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_benchmarks": None}

    @property
    def benchmarks(self) -> Any:
        if self._benchmarks is None and self.spec.benchmarks:
            from shardsmith.text.decontaminate import Benchmarks

            self._benchmarks = Benchmarks.load(self.spec.benchmarks, ngram=self.spec.ngram,
                                               field=self.spec.benchmark_field)
        return self._benchmarks

    def warnings(self) -> list[str]:
        """What a user should know before the run (the benchmark files read here: an unreadable one
        is a one-line UsageError now, not in a worker)."""
        if not self.spec.benchmarks:
            return []
        few = self.benchmarks.fewer_than(min(self.spec.ngram, SHORT_ITEM_WORDS))
        if not few:
            return []
        name, line = few[0]
        return [f"--decontaminate: {plural(len(few), 'item')} of fewer than "
                f"{min(self.spec.ngram, SHORT_ITEM_WORDS)} words (the first: {name}:{line}) match wherever "
                f"those words appear in a document, and may drop many documents"]

    @property
    def compares_normalized(self) -> bool:
        """Whether a rule compares normalized text (normalized once per document, for all of them)."""
        return bool(self.spec.benchmarks) or self.spec.dedup in ("exact", "minhash")

    def normalized(self, texts: Sequence[str]) -> Sequence[str] | None:
        """The texts normalized (``text/textnorm.py``, the batch at once: ``text/textnorm_batch.py``)
        when a rule compares them so, else None."""
        return textnorm_batch.normalize_batch(texts) if self.compares_normalized else None

    def contaminated(self, texts: Sequence[str], normal: Sequence[str] | None = None) -> np.ndarray:
        """Per text, the benchmark item it shares an n-gram with (an index into ``benchmarks.items``),
        or -1; ``normal``: the texts normalized already."""
        if not self.spec.benchmarks:
            return np.full(len(texts), -1, dtype=np.int64)
        if normal is None:
            return self.benchmarks.match(texts)  # type: ignore[no-any-return]
        return self.benchmarks.match(normal, normalized=True)  # type: ignore[no-any-return]

    def doc_columns(self, texts: Sequence[str], normal: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """The dedup key of each kept document, by fact column; ``normal``: the texts normalized already."""
        if self.spec.exact:
            if self.spec.dedup == "exact:raw":
                return {"hash": textnorm.doc_hashes(texts, raw=True)}
            return {"hash": textnorm_batch.doc_hashes(textnorm_batch.normalize_batch(texts) if normal is None
                                                      else normal)}
        if self.minhash is not None:
            from shardsmith.text.minhash import band_keys

            return {"bands": band_keys(texts if normal is None else normal, self.minhash, normalized=normal is not None)}
        return {}


def dropped_by_rule(cleaning: Any) -> list[tuple[str, str | None, int | None, int, int]]:
    """What a manifest's ``cleaning`` record says each rule dropped, for the closing line, ``inspect``
    and the report: (the rule as given, e.g. ``--dedup exact``; the benchmark file or None; its items;
    documents; payload units)."""
    if not isinstance(cleaning, dict):
        return []
    units = cleaning.get("units", "tokens")
    rows: list[tuple[str, str | None, int | None, int, int]] = []
    if (d := cleaning.get("dedup")) is not None:
        rows.append((f"--dedup {d['rule']}", None, None, d["documents"], d[units]))
    for name, b in (cleaning.get("decontaminate") or {}).get("benchmarks", {}).items():
        rows.append(("--decontaminate", name, b["items"], b["documents"], b[units]))
    return rows
