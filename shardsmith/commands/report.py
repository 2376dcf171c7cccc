"""The one-line reports a converting command prints when it ends: its splits, a stage's part, what was skipped."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from shardsmith.core.words import plural


def report_stage(out: Path, result: dict[str, Any]) -> bool:
    """One line for a stage that wrote no manifest; False when ``result`` is a manifest."""
    if "stage" not in result:
        return False
    who = f"{out}: {result['stage']} rank {result['rank']} of {result['world_size']}"
    if result.get("idle"):
        click.echo(f"{who}: nothing to do ({result['stage']} runs on rank 0)")
    elif result["stage"] == "plan":
        what = ("already planned" if result["segments"] is None
                else f"{plural(result['segments'], 'segment')} from {plural(result['tasks'], 'scatter task')}")
        click.echo(f"{who}: planned {plural(result['splits'], 'split')} for "
                   f"{plural(result['world_size'], 'gather rank')} ({what})")
    elif result["stage"] == "gather":
        wrote = [f"{split} shards {a}..{b - 1}" if b >= 0 else f"{split} (every shard)"
                 for split, (a, b) in result["shards"].items()]
        click.echo(f"{who}: wrote {', '.join(wrote) or 'no shard (more ranks than shards, or a format one writer makes on rank 0)'}")
    else:
        click.echo(f"{who}: {plural(result['tasks'], 'task')}, {plural(result['records'], 'record')} read, "
                   f"{result['skipped']:,} skipped" + (f", {result['dropped']:,} dropped (--balance, --decontaminate)" if result.get("dropped") else ""))
    return True


def inputs_left_out(source: dict[str, Any]) -> str:
    """The closing line's note of the input objects ``--on-error skip`` left out ("" for none)."""
    count = len(source.get("skipped_inputs") or [])
    if not count:
        return ""
    return f"; {plural(count, 'input object')} skipped (--on-error skip), listed in the manifest"


def balance_dropped(manifest: dict[str, Any]) -> str:
    """The closing line's note of the samples ``--balance`` left out ("" without --balance)."""
    balance = manifest.get("balance")
    if not isinstance(balance, dict):
        return ""
    rule = ",".join(f"{k}={balance[k]}" for k in ("max", "ratio", "label") if k in balance)
    return f"; {plural(balance['dropped'], 'sample')} dropped by --balance {rule}"


def cleaning_dropped(manifest: dict[str, Any]) -> str:
    """The closing line's note of what --dedup and --decontaminate dropped, per rule and benchmark
    file ("" without them)."""
    from shardsmith.text.cleaning import dropped_by_rule

    cleaning = manifest.get("cleaning")
    rows = dropped_by_rule(cleaning)
    if not rows:
        return ""
    units = cleaning.get("units", "tokens")  # type: ignore[union-attr]
    return "".join(f"; {rule}{'' if name is None else ' ' + name} dropped {plural(docs, 'document')} "
                   f"({plural(count, units.removesuffix('s'))})" for rule, name, _, docs, count in rows)


def report_skipped(out: Path | str, source: dict[str, Any], *, shown: int = 5) -> None:
    """Which records and files were skipped (``--on-error skip``), on one line."""
    entries = [*source["skipped"]["records"], *source.get("unread", [])]
    if not entries:
        return
    names, told = [], False
    for e in entries[:shown]:
        where = next((f"{unit} {e[unit]}" for unit in ("line", "row", "entry", "event", "image")
                      if e.get(unit) is not None), None)
        if where is None and e.get("record") is not None:  # a source whose unit is "record": 0-based there
            where = f"record {e['record'] + 1}"
        tail = " on" if where and e.get("unread_tail") else ""
        if where:
            names.append(f"{e['file']} {where}{tail}")
        elif e.get("unread_tail"):  # a record file broken part-way: what follows the break is unread
            names.append(f"{e['file']} (rest of the file)")
        else:  # a whole input skipped (an image is one sample): why, in its words
            told = told or bool(e.get("reason"))
            names.append(f"{e['file']}: {e['reason']}" if e.get("reason") else e["file"])
    sep = "; " if told else ", "  # a reason may hold commas of its own: entries with one are set apart by semicolons
    more = f"{sep}… ({len(entries)} in all)" if len(entries) > shown else ""
    click.echo(f"{out}: skipped {sep.join(names)}{more}; reasons in {str(out).rstrip('/')}/manifest.json", err=True)
