"""What cleaning removed, told once: the manifest's ``cleaning`` record (documents and payload
units per rule and per benchmark file) and the ``--removed`` list (every document left out, where
it was, the rule, and the document it duplicated or the benchmark item it matched)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from shardsmith.core.fsutil import atomic_write_bytes

if TYPE_CHECKING:
    from shardsmith.engine.shuffle.run import Converted


def cleaning_record(done: Converted) -> dict[str, Any]:
    """The manifest's ``cleaning``: what each rule removed, and whether documents carry origins."""
    assert done.cleaning is not None
    spec, units = done.cleaning.spec, done.cleaning.spec.units
    record: dict[str, Any] = {"units": units}
    total = [0, 0]
    if spec.dedup is not None:
        rule: dict[str, Any] = {"rule": spec.dedup}
        if (near := spec.minhash()) is not None:
            rule.update(near.describe())
        found = done.duplicates.summary(units) if done.duplicates is not None else {"documents": 0, units: 0}
        record["dedup"] = {**rule, **found}
        total = [total[0] + found["documents"], total[1] + found[units]]
    if spec.benchmarks:
        per_file: dict[str, Any] = {}
        bench = done.cleaning.benchmarks
        for name in spec.benchmarks:
            docs = toks = 0
            for r in done.results:
                docs_units = r.rules.get(f"decontaminate:{name}")
                if docs_units:
                    docs, toks = docs + docs_units[0], toks + docs_units[1]
            per_file[name] = {"items": bench.count(name), "documents": docs, units: toks}
            total = [total[0] + docs, total[1] + toks]
        record["decontaminate"] = {"ngram": spec.ngram, "field": spec.benchmark_field, "benchmarks": per_file}
    record["removed"] = {"documents": total[0], units: total[1]}
    if spec.provenance:
        record["provenance"] = True
    return record


def write_removed(path: str | Path, done: Converted) -> int:
    """The ``--removed`` JSONL, in input order; returns its line count."""
    order = {rel: index for index, (rel, _) in done.named.items()}
    entries = [e for r in done.results for e in r.removed]
    if done.duplicates is not None:
        entries += done.duplicates.entries(done.named)
    entries.sort(key=lambda e: (order.get(e["file"], -1), e.get("record") or 0))
    atomic_write_bytes(Path(path), b"".join(orjson.dumps(e) + b"\n" for e in entries))
    return len(entries)
