"""The section every dataset has, from its manifest alone: split sizes, shard sizes, samples per shard."""

from __future__ import annotations

from typing import Any

import numpy as np

from shardsmith.core.sizes import format_size
from shardsmith.core.words import plural
from shardsmith.kit.sections import figures
from shardsmith.kit.sections.model import SUMMARY_HEADER, Section, Table, summary_row
from shardsmith.text.cleaning import dropped_by_rule

MAX_SHARD_ROWS = 200


def splits_section(manifest: dict[str, Any], *, unit: str) -> Section:
    """Splits (samples, shards, bytes) and each shard's size and sample count (``unit``: what a sample is)."""
    splits = manifest["splits"]
    rows = [(name, s["samples"], len(s["shards"]), sum(x["bytes"] for x in s["shards"]),
             format_size(sum(x["bytes"] for x in s["shards"]))) for name, s in splits.items()]
    section = Section(title="Splits and shards")
    section.tables.append(Table(caption="Splits", header=("split", f"{unit}s", "shards", "bytes", "size"), rows=rows))
    shards = [(name, x) for name, s in splits.items() for x in s["shards"]]
    if not shards:
        section.notes.append("The dataset holds no shards.")
        return section
    sizes = np.array([x["bytes"] for _, x in shards], np.float64)
    samples = np.array([x["samples"] for _, x in shards], np.float64)
    section.tables.append(Table(caption="Shards", header=SUMMARY_HEADER, rows=[
        summary_row("shard size", sizes / 1e6, "MB"), summary_row(f"{unit}s per shard", samples, unit + "s")]))
    shown = shards[:MAX_SHARD_ROWS]
    section.tables.append(Table(
        caption="Every shard", header=("split", "shard", f"{unit}s", "bytes"),
        rows=[(name, x["path"], x["samples"], x["bytes"]) for name, x in shown],
        note=f"the first {len(shown):,} of {len(shards):,} shards" if len(shards) > len(shown) else ""))
    starts, at = [], 0
    for name, s in splits.items():
        if s["shards"]:
            starts.append((at, name))
        at += len(s["shards"])
    section.figures.append(figures.per_index("shard-sizes", title="Shard sizes, in manifest order",
                                             values=sizes / 1e6, xlabel="shard (all splits, in order)",
                                             ylabel="size (MB)", splits=starts))
    section.figures.append(figures.per_index("samples-per-shard", title=f"{unit.capitalize()}s per shard",
                                             values=samples, xlabel="shard (all splits, in order)",
                                             ylabel=f"{unit}s", splits=starts))
    return section


def cleaning_section(manifest: dict[str, Any]) -> Section | None:
    """What --dedup and --decontaminate dropped (documents and payload units per rule and benchmark
    file), and whether documents carry their origins (None: the run cleaned nothing)."""
    cleaning = manifest.get("cleaning")
    if not isinstance(cleaning, dict):
        return None
    units = cleaning.get("units", "tokens")
    rows: list[tuple[Any, ...]] = [(rule, "" if name is None else f"{name} ({plural(items, 'item')})", docs, count)
                                   for rule, name, items, docs, count in dropped_by_rule(cleaning)]
    section = Section(title="Cleaning")
    if rows:
        total = cleaning.get("removed", {})
        rows.append(("all rules", "", total.get("documents", 0), total.get(units, 0)))
        section.tables.append(Table(caption="Documents dropped", header=("rule", "benchmark", "documents", units),
                                    rows=rows))
    if (d := cleaning.get("dedup")) is not None and d["rule"] == "minhash":
        section.notes.append(", ".join(f"{k} {v}" for k, v in d.items() if k not in ("rule", "documents", units)))
    if (c := cleaning.get("decontaminate")) is not None:
        section.notes.append(f"A document sharing a {c['ngram']}-word n-gram with a benchmark item is dropped "
                             f"(shorter items match whole).")
    if cleaning.get("provenance"):
        section.notes.append("Every document carries its origin (input file, line or row, byte offset): "
                             "`shardsmith trace OUT INDEX`.")
    return section
