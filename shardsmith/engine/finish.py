"""The end of every conversion, written once: account for every record, describe each split, add
the format's fields, and commit the manifest (the dataset exists from that moment)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from shardsmith.core import manifest as manifest_mod
from shardsmith.core.file_listing import total_size
from shardsmith.engine.inputs.url_inputs import input_root, stop_staging
from shardsmith.engine.shuffle.cleaned import cleaning_record, write_removed
from shardsmith.engine.shuffle.run import Converted, Tally
from shardsmith.kit.dataset_card import write_card

if TYPE_CHECKING:
    from shardsmith.core.input_file import InputFile
    from shardsmith.engine.output.session import OutputRun
    from shardsmith.kit.format import Format, WriteJob

MAX_LISTED_INPUTS = 1000  # beyond this many inputs the manifest holds their count, not their names


def commit_dataset(session: OutputRun, *, fmt: Format, job: WriteJob, done: Converted, files: Sequence[InputFile],
                   source: dict[str, Any], schema: dict[str, Any], extras: dict[str, Any] | None = None,
                   copies: int = 1, events: bool = False, used: tuple[tuple[str, str], ...] = (),
                   unread: Sequence[dict[str, Any]] = (), skipped_inputs: Sequence[dict[str, str]] = (),
                   written: int | None = None, list_inputs: bool = False) -> dict[str, Any]:
    """The manifest of a finished run, committed; returns it.

    ``source``: the reader's fields (name and what it adds); ``events``: each split also counts the
    events its samples hold (several per sample with ``--events-per-sample``); ``used``: the
    registered objects the run used, as (kind, name) -- those of other packages are named with
    their distribution and version in ``plugins``; ``unread``: input files left out whole
    (``--on-error skip`` of a file that cannot be opened), listed with the files that broke off;
    ``skipped_inputs``: objects that stayed unreadable while staging (``remote.skipped_inputs``);
    ``written``: the records the shards hold, where a sample is not one record (packed sequences);
    ``list_inputs``: name every input, however many (``--provenance`` indexes them).
    """
    from shardsmith import registry

    stop_staging()  # before the commit removes the scratch folder the stager writes into
    opts = job.opts
    outputs = done.outputs
    counts = {name: o.events or sum(s.samples for s in o.shards) for name, o in outputs.items()} if events else None
    tally = Tally.of(done.results, outputs, copies=copies, inputs=files,
                     written=sum(counts.values()) if counts is not None else written, unread_files=unread,
                     duplicates=0 if done.duplicates is None else len(done.duplicates.rows))
    splits: dict[str, Any] = {}
    for name, o in outputs.items():
        entry: dict[str, Any] = {"samples": sum(s.samples for s in o.shards)}
        if counts is not None:
            entry["events"] = counts[name]
        entry.update(fmt.split_fields(job, name, o))
        entry["shards"] = [s.to_json() for s in o.shards]
        splits[name] = entry
    provenance = done.cleaning is not None and done.cleaning.spec.provenance
    inputs: Any = [f.rel for f in files] if list_inputs or provenance or len(files) <= MAX_LISTED_INPUTS \
        else len(files)
    source = {**source, "inputs": inputs, "input_bytes": total_size(files), **tally.source(),
              "limit": opts.limit}
    if (root := input_root(files)) is not None:  # inputs staged from a URL (shown without userinfo or query)
        source["input_root"] = root
    if skipped_inputs:  # objects --on-error skip left out: they stayed unreadable
        source["skipped_inputs"] = list(skipped_inputs)
    fields = dict(extras or {})
    if done.cleaning is not None:
        fields["cleaning"] = cleaning_record(done)
        if getattr(opts, "removed", None):
            write_removed(opts.removed, done)
    # the format's own options, as its writers got them (kit/options.py), unless its own fields hold them
    if job.options and (fmt.options is None or fmt.options.recorded):
        fields["format_options"] = job.options.as_dict()
    for key, value in fmt.manifest_fields(job, outputs).items():
        both = isinstance(value, dict) and isinstance(fields.get(key), dict)
        fields[key] = {**fields[key], **value} if both else value
    if session.run is not None:  # who made it, exactly: the same command run again finds it complete
        fields["run"] = session.run
    made_by = registry.provenance([("format", fmt.name), *used])
    if made_by:
        fields["plugins"] = made_by
    manifest = manifest_mod.new_manifest(fmt=fmt.manifest_format, seed=opts.seed, shuffle=opts.shuffle,
                                         source=source, schema=schema, splits=splits, **fields)
    write_card(session.out, manifest, fmt)  # README.md, before the manifest (uploaded with the shards)
    return session.commit(manifest)
