"""``shardsmith inspect``: what a dataset holds, from its manifest, plus a few decoded samples; of a
folder, or of a dataset at a URL read as the loader reads it (``kit/dataset_files.files_at``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
import orjson

from shardsmith import registry
from shardsmith.commands.report import cleaning_dropped
from shardsmith.core.sizes import format_size
from shardsmith.core.words import plural
from shardsmith.kit.dataset_files import files_at


def summary(where: str | Path, *, samples: int) -> dict[str, Any]:
    with files_at(where) as files:
        m = files.load_manifest()
        out = files if files.streamed else files.root  # what the format's hooks are given
        return _summary(files.where, out, m, samples=samples)


def _summary(where: str, out: Any, m: dict[str, Any], *, samples: int) -> dict[str, Any]:
    info: dict[str, Any] = {
        "path": where, "format": m["format"], "created": m["created"], "tool_version": m["tool_version"],
        "seed": m["seed"], "shuffle": m["shuffle"],
        "source": {k: v for k, v in m["source"].items() if k != "skipped"},
        "skipped": (m["source"].get("skipped") or {}).get("count", 0),
        "splits": {name: {"samples": s["samples"], "shards": len(s["shards"]),
                          "bytes": sum(x["bytes"] for x in s["shards"]),
                          **({"tokens": s["tokens"]} if "tokens" in s else {}),
                          **({"events": s["events"]} if "events" in s else {})}
                   for name, s in m["splits"].items()},
        "schema": m["schema"],
        **({"cleaning": m["cleaning"]} if "cleaning" in m else {}),
    }
    inputs = m["source"].get("inputs") or []
    info["source"]["inputs"] = inputs if isinstance(inputs, int) else len(inputs)  # a count beyond 1,000 inputs
    fmt = registry.format_of(m, where=where)
    info.update(fmt.describe(out, m))
    if "events" in m:
        info["events"] = {k: v for k, v in m["events"].items() if k != "skipped_fields"}
        info["events"]["fields"] = len(m["schema"])
    info["samples"] = fmt.show(out, m, samples)
    return info


def run(where: str | Path, *, as_json: bool, samples: int) -> None:
    info = summary(where, samples=samples)
    if as_json:
        sys.stdout.write(orjson.dumps(info, option=orjson.OPT_INDENT_2).decode() + "\n")
        return
    echo = click.echo
    echo(f"{info['path']}: {info['format']} dataset, shardsmith {info['tool_version']}, created {info['created']}")
    src = info["source"]
    records = src.get("records")
    echo(f"  source: {src.get('reader')} reader, {plural(src['inputs'], 'input file')}, "
         f"{'unknown records' if records is None else plural(records, 'record')}, {info['skipped']:,} skipped")
    if src.get("skipped_inputs"):
        left_out = src["skipped_inputs"]
        echo(f"  skipped inputs (--on-error skip): {len(left_out):,}: "
             f"{', '.join(str(s.get('url')) for s in left_out[:3])}{', …' if len(left_out) > 3 else ''}")
    echo(f"  shuffle: {'exact, seed ' + str(info['seed']) if info['shuffle'] else 'off (input order)'}")
    if "cleaning" in info:
        said = cleaning_dropped(info).lstrip("; ")
        traced = "documents carry their origins (shardsmith trace)" if info["cleaning"].get("provenance") else ""
        echo(f"  cleaning: {'; '.join(x for x in (said, traced) if x)}")
    for name, s in info["splits"].items():
        tokens = f", {plural(s['tokens'], 'token')}" if "tokens" in s else ""
        events = f" ({plural(s['events'], 'event')})" if "events" in s and s["events"] != s["samples"] else ""
        echo(f"  split {name}: {plural(s['samples'], 'sample')}{tokens}{events} in {plural(s['shards'], 'shard')}, "
             f"{format_size(s['bytes'])}")
    if "tokenizer" in info:
        t = info["tokenizer"]
        echo(f"  tokenizer: vocab {t['vocab_size']}, eos {t.get('eos_token')!r} ({t.get('eos_id')}), dtype {t['dtype']}, "
             f"engine {t.get('engine')}, sha256 {t['sha256'][:12]}…")
    if info.get("classes"):
        echo(f"  classes: {len(info['classes']):,} ({', '.join(info['classes'][:8])}{', …' if len(info['classes']) > 8 else ''})")
    if info.get("events"):
        e = info["events"]
        echo(f"  events: {plural(e['fields'], 'field')}, counters {', '.join(map(str, e.get('counters') or []))}"
             + (f", {e['events_per_sample']} per sample" if "events_per_sample" in e else ""))
    for line in info.get("format_lines", []):  # what the format's ``describe`` says of itself
        echo(f"  {line}")
    if info.get("augment"):
        echo(f"  augment: {info['augment']}")
    for s in info.get("samples", []):
        if "tokens" in s:
            echo(f"  sample {s['split']}[{s['index']}]: {plural(s['tokens'], 'token')} {s['ids']}…")
            if s["text"] is not None:
                echo(f"    {s['text']!r}")
        elif "fields" in s:
            echo(f"  event {s['split']}[{s['index']}]:")
            for name, f in s["fields"].items():
                echo(f"    {name}: shape {tuple(f['shape'])} {f['first']}")
        else:
            echo(f"  sample {s['split']}[{s['index']}]: key {s['key']}, members {s['members']}")
