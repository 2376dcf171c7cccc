"""``shardsmith trace``: the documents a training sample came from, back to their input lines.

``trace OUT INDEX`` names the documents of window or packed sequence INDEX (``sources(i)`` of the
dataset, from the origins ``pack-tokens --provenance`` wrote beside each shard), each with the
start of its text read again from its input, when the input is still there and unchanged (its size
as the manifest recorded it, the document's text hash as the origins recorded it): else the line
says ``changed`` or ``missing``. ``trace OUT --state FILE`` does the same for every sample of the
next batch a saved loader would yield (the JSON the README's training loop saves).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import click
import orjson

from shardsmith.core import manifest as manifest_mod
from shardsmith.core.side_file import STATE_LIMIT, read_side_file
from shardsmith.core.words import plural
from shardsmith.errors import DatasetError, UsageError
from shardsmith.kit import manifest_io
from shardsmith.kit.doc_origin import text_hashes
from shardsmith.kit.rank_split import (
    EpochLayout,
    EpochOrder,
    adapter_states,
    global_position,
    read_state,
    whole,
)
from shardsmith.text.chat import ChatFields, record_text

SHOWN_CHARS = 80


def open_samples(out: Path, *, split: str, seq_len: int | None) -> Any:
    """The split as training reads it: packed sequences, or windows of ``seq_len`` (the manifest's)."""
    from shardsmith.formats.tokens.dataset import TokenDataset
    from shardsmith.formats.tokens.packed import PackedSequences

    m = manifest_io.load(out)
    if split not in m["splits"]:
        raise UsageError(f"{out}: no split {split!r} (splits: {', '.join(m['splits'])})")
    if m.get("packing") is not None:
        return PackedSequences(out, split=split)
    if seq_len is None and not m.get("seq_len"):
        raise UsageError(f"{out}: the manifest records no seq_len: give --seq-len, the windows' length")
    return TokenDataset(out, seq_len=seq_len, split=split, windows_of_chat=True)  # the tokens' origins only


class InputTexts:
    """Documents read again from the inputs named in the manifest, each checked against its origin."""

    def __init__(self, manifest: dict[str, Any], *, inputs: Path | None) -> None:
        from shardsmith import registry
        from shardsmith.kit.reader import MultiReader

        source = manifest["source"]
        self.field = source.get("text_field") or "text"
        self.sizes = source.get("input_sizes") or []
        self.root = inputs if inputs is not None else source.get("input_dir")
        if not isinstance(self.field, str) or not isinstance(self.sizes, list) \
                or not all(isinstance(x, int) for x in self.sizes) or not isinstance(self.root, str | Path | None):
            raise DatasetError("the manifest's source.text_field, input_sizes or input_dir is not what "
                               "pack-tokens --provenance writes")
        chat = manifest.get("chat")
        self.chat = None if not isinstance(chat, dict) else ChatFields(
            messages=chat.get("messages_field") or "messages", prompt=chat.get("prompt_field"),
            completion=chat.get("completion_field"))
        self.reader = MultiReader(readers=[cls.for_text(self.field) if self.chat is None else cls.for_records()
                                           for cls in registry.sources_with_text()])

    def text(self, doc: dict[str, Any]) -> str:
        """The document's first characters (JSON-quoted), or ``missing``/``changed`` and why."""
        from shardsmith.core.input_file import InputFile

        rel = doc["input"]
        if not isinstance(rel, str):
            return "missing (the manifest names this input with no path)"
        if self.root is None:
            return "missing (the manifest does not say where the inputs are: give --inputs DIR)"
        if not manifest_mod.safe_relative(rel):
            return "missing (not a plain relative input name)"
        path = Path(self.root) / rel
        try:
            size = path.stat().st_size
        except OSError:
            return f"missing ({path} is not there)"
        if doc["file"] < len(self.sizes) and size != self.sizes[doc["file"]]:
            return f"changed ({path}: {size} bytes, {self.sizes[doc['file']]} when it was read)"
        file = InputFile(path=str(path), rel=rel, index=doc["file"], size=size)
        try:
            self.reader.reader_for(file)
        except StopIteration:
            return "missing (no source reads this kind of file)"
        value = self._record(file, doc)
        text = self._text_of(value)
        if not isinstance(text, str):
            return "changed (no such record, or no text in it)"
        if int(text_hashes([text])[0]) != doc["hash"]:
            return "changed (the text differs from the document's)"
        shown = orjson.dumps(text[:SHOWN_CHARS]).decode()
        return shown + ("…" if len(text) > SHOWN_CHARS else "")

    def _text_of(self, value: Any) -> str | None:
        """A record's text as its origin hashed it: the text field, or a conversation as read (``--chat``)."""
        if self.chat is not None:
            return record_text(value, self.chat) if isinstance(value, dict) else None
        text = value.get(self.field) if isinstance(value, dict) else None
        return text if isinstance(text, str) else None

    def _record(self, file: Any, doc: dict[str, Any]) -> Any:
        """The record itself: read at its byte offset, or from the start of its task (compressed, Parquet)."""
        from shardsmith.kit.reader import Task

        record = doc["record"]
        if doc["offset"] is not None:
            task = Task(index=0, file=file, start=doc["offset"], stop=-1, first_record=record)
        else:
            tasks = [t for t in self.reader.plan([file], chunk_bytes=64 << 20) if t.first_record <= record]
            if not tasks:
                return None
            task = tasks[-1]
        try:
            for number, value in self.reader.read(task):
                if number >= record:
                    return value if number == record else None
        except (OSError, ValueError):
            return None
        return None


def doc_lines(docs: list[dict[str, Any]], texts: InputTexts) -> Iterator[str]:
    """One line per document: its tokens in the sample, where it is, and its text."""
    for d in docs:
        unit = next((k for k in d if k not in ("input", "file", "record", "offset", "hash", "start", "stop")), None)
        where = f"{d['input']} {unit} {d[unit]}" if unit else f"{d['input']} record {d['record']}"
        at = f" (byte {d['offset']})" if d["offset"] is not None else ""
        yield f"  tokens {d['start']}:{d['stop']}  {where}{at}  {texts.text(d)}"


def trace_index(out: Path, index: int, *, split: str, seq_len: int | None, inputs: Path | None) -> None:
    ds = open_samples(out, split=split, seq_len=seq_len)
    try:
        docs = ds.sources(index)
    except IndexError as exc:
        raise UsageError(f"{out}: {exc}") from None
    texts = InputTexts(ds.manifest, inputs=inputs)
    click.echo(f"{out} [{split}] {_kind(ds)} {index}: {plural(len(docs), 'document')}")
    for line in doc_lines(docs, texts):
        click.echo(line)


def _kind(ds: Any) -> str:
    return "sequence" if hasattr(ds, "pad_id") else "window"


def next_batch(saved: Any, *, length: int | None = None) -> tuple[dict[str, Any], list[int]]:
    """Where the loader that saved ``saved`` goes on, and the sample indices of its next batch.

    ``saved``: ``{"epoch": e, "loader": StatefulDataLoader.state_dict()}`` (the README's loop), or
    the loader's (or adapter's) state itself. Every rank takes the same number of batches, so the
    rank's next batch is the first of a layout that starts where the run has consumed the order
    to (``global_position``); a state at the end of its epoch goes on with the next epoch.
    ``length``: the samples the dataset holds, checked before the epoch's order is made (a state
    that says otherwise is refused, never followed)."""
    loader = saved.get("loader", saved) if isinstance(saved, Mapping) else saved
    asked = saved.get("epoch") if isinstance(saved, Mapping) and "loader" in saved else None
    if next(adapter_states(loader), None) is None:
        raise UsageError("no shardsmith loader state in it (TokenBatches, PackedBatches or EpochBatchSampler)")
    try:
        later = 0 if asked is None else whole(asked, "epoch")  # the loop's own epoch, beside the loader's state
        found = read_state(next(adapter_states(loader)))
        order = EpochOrder.named(found["order"])
        n = found["length"]
        if length is not None and n != length:  # before anything the state's numbers size
            raise LengthMismatch(n)
        position = global_position(loader)
        epoch = position["epoch"]
        layout = _layout(found, start=position["position"])
        if layout.steps == 0:  # the epoch is over: the loop's next epoch starts at 0
            epoch = max(later, epoch + 1)
            layout = _layout(found, start=0)
        if layout.steps == 0:
            raise ValueError(f"an epoch of {n} samples gives rank {found['rank']} no batch")
        indices = order(n, shuffle=found["shuffle"], seed=found["seed"], epoch=epoch)
        where = {"epoch": epoch, "rank": found["rank"], "world_size": found["world_size"],
                 "position": layout.start, "length": n}
        return where, indices[layout.positions(0)].tolist()
    except LengthMismatch:
        raise
    except (ValueError, KeyError, TypeError, IndexError, ZeroDivisionError, OverflowError) as exc:
        raise UsageError(f"cannot follow this loader state: {exc}") from None


class LengthMismatch(Exception):
    """A saved state of a loader over another number of samples than the dataset's."""

    def __init__(self, length: int) -> None:
        super().__init__(length)
        self.length = length


def _layout(state: Mapping[str, Any], *, start: int) -> EpochLayout:
    """The rank's layout of a ``read_state`` state from position ``start`` of the epoch."""
    return EpochLayout(total=state["length"], start=start, batch_size=state["batch_size"], rank=state["rank"],
                       world_size=state["world_size"], drop_last=state["drop_last"])


def trace_state(out: Path, state_file: Path, *, split: str, seq_len: int | None, inputs: Path | None) -> None:
    try:
        saved = orjson.loads(read_side_file(state_file, what="--state", limit=STATE_LIMIT))
    except orjson.JSONDecodeError as exc:
        raise UsageError(f"{state_file}: not JSON ({exc})") from None
    ds = open_samples(out, split=split, seq_len=seq_len)
    try:
        where, indices = next_batch(saved, length=len(ds))
    except LengthMismatch as exc:
        hint = "" if _kind(ds) == "sequence" else f" of --seq-len {ds.seq_len} (give the loader's)"
        raise UsageError(f"{state_file}: a loader over {exc.length:,} samples; {out} [{split}] holds "
                         f"{len(ds):,} {_kind(ds)}s{hint}") from None
    texts = InputTexts(ds.manifest, inputs=inputs)
    click.echo(f"{out} [{split}]: the next batch of rank {where['rank']} of {where['world_size']}, epoch "
               f"{where['epoch']}, from position {where['position']:,} of the epoch's order: "
               f"{len(indices)} {_kind(ds)}s")
    for i in indices:
        docs = ds.sources(i)
        click.echo(f"{_kind(ds)} {i}: {plural(len(docs), 'document')}")
        for line in doc_lines(docs, texts):
            click.echo(line)


def run(out: Path, index: int | None, *, split: str, seq_len: int | None, state: Path | None,
        inputs: Path | None) -> None:
    if (index is None) == (state is None):
        raise UsageError("give either INDEX (a window or sequence) or --state FILE (a saved loader state)")
    if not (out / manifest_mod.MANIFEST).is_file():
        raise DatasetError(f"{out}: not a dataset folder (no manifest.json)")
    if inputs is not None and not os.path.isdir(inputs):
        raise UsageError(f"--inputs {inputs}: not a folder")
    if state is not None:
        trace_state(out, state, split=split, seq_len=seq_len, inputs=inputs)
    else:
        assert index is not None
        trace_index(out, index, split=split, seq_len=seq_len, inputs=inputs)
