"""Packed token arrays as a registered format: Megatron ``.bin``/``.idx`` shards (and nanoGPT's flat
``.bin``), written by ``pack-tokens`` and read as documents or as windows."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any

import numpy as np

from shardsmith.core import manifest as m_
from shardsmith.core import manifest as manifest_mod
from shardsmith.core.dtypes import safe_dtype
from shardsmith.core.own_files import OwnFiles
from shardsmith.core.words import plural
from shardsmith.errors import DatasetError
from shardsmith.formats.tokens.neighbours import HF_FILES, NANOGPT_META, NANOGPT_SUFFIX, TOKENIZER
from shardsmith.formats.tokens.options import OPTIONS
from shardsmith.kit import manifest_io
from shardsmith.kit.format import CardData, Format, Rate, WriteJob, first_split
from shardsmith.kit.writer import SHARD_NAMES, ShardRange, Writer


class TokensFormat(Format):
    name = "tokens"
    manifest_format = "tokens"
    option = OPTIONS.to  # written by pack-tokens' job, which convert --to tokens builds too (options.py)
    options = OPTIONS
    accepts = ("rows",)
    sample_unit = "document"
    # the shards and their companions (.idx, .origins.npy, .mask.bin, .cu.npy), nanoGPT's flat files,
    # the tokenizer and the files other tools read beside it (``neighbours.py``)
    own_files = OwnFiles(files=(SHARD_NAMES, f"*{NANOGPT_SUFFIX}", TOKENIZER, *HF_FILES, NANOGPT_META))

    def validate(self, m: dict[str, Any], bad: Any) -> None:
        """The manifest fields this format's readers read, each typed (``core.manifest.check``)."""
        tok = m_.need(m, "tokenizer", dict, bad)
        path = m_.need(tok, "path", str, bad, where="tokenizer.")
        if not m_.safe_relative(path):
            raise bad(f"'tokenizer.path' {path!r} is not a plain relative path inside the dataset folder")
        m_.need(tok, "sha256", str, bad, where="tokenizer.")
        m_.count(tok, "vocab_size", bad, where="tokenizer.", low=1)
        if m_.dtype_of(m_.need(tok, "dtype", str, bad, where="tokenizer."), bad, "'tokenizer.dtype'").kind not in "iu":
            raise bad(f"'tokenizer.dtype' is {tok['dtype']!r}: token ids are integers")
        for key in ("eos_id", "bos_id"):
            m_.count(tok, key, bad, where="tokenizer.", optional=True, nullable=True)
        for key in ("eos_token", "bos_token"):
            m_.need(tok, key, str, bad, where="tokenizer.", optional=True, nullable=True)
        m_.need(tok, "engine", str, bad, where="tokenizer.", optional=True)
        m_.need(tok, "trained", bool, bad, where="tokenizer.", optional=True)
        m_.count(tok, "vocab_size_asked", bad, where="tokenizer.", optional=True, low=1)
        itemsize = m_.dtype_of(tok["dtype"], bad, "'tokenizer.dtype'").itemsize
        for name, split in m["splits"].items():
            for shard in split["shards"]:
                if not isinstance(shard.get("index"), dict):
                    raise bad(f"shard {shard['path']!r} of split {name!r} names no '.idx' index")
                m_.file_entry(shard["index"], bad, f"splits.{name}.shards[].index")
                tokens = m_.count(shard, "tokens", bad, where=f"splits.{name}.shards[].", optional=True)
                if tokens is not None and tokens * itemsize != shard["bytes"]:
                    raise bad(f"shard {shard['path']!r}: {tokens} tokens of {itemsize} bytes are not its "
                              f"{shard['bytes']} bytes")
                for key in ("real_tokens", "documents", "documents_split"):  # packed shards' records
                    m_.count(shard, key, bad, where=f"splits.{name}.shards[].", optional=True)
                if "origins" in shard:  # --provenance
                    m_.file_entry(shard["origins"], bad, f"splits.{name}.shards[].origins")
                if "mask" in shard or m.get("chat") is not None:  # --chat: every shard has its loss bits
                    if m.get("chat") is None:
                        raise bad(f"shard {shard['path']!r} names a loss mask, but the manifest has no 'chat' record")
                    m_.file_entry(shard.get("mask"), bad, f"splits.{name}.shards[].mask")
                    for key in ("tokens", "trained"):
                        m_.count(shard["mask"], key, bad, where=f"splits.{name}.shards[].mask.")
            recorded = [shard.get("tokens") for shard in split["shards"]]
            if split.get("tokens") is not None and None not in recorded and split["tokens"] != sum(recorded):
                raise bad(f"split {name!r}: 'tokens' is {split['tokens']}, its shards hold {sum(recorded)}")
            _packing_record(split.get("packing"), bad, where=f"splits.{name}.packing.")
        seq_len = m_.count(m, "seq_len", bad, optional=True, nullable=True, low=1)
        if seq_len is not None and seq_len >= 1 << 31:
            raise bad(f"'seq_len' is {seq_len}, more than 2**31 - 1")
        packing = m_.need(m, "packing", dict, bad, optional=True, nullable=True)
        if packing is not None:
            m_.count(packing, "seq_len", bad, where="packing.", low=1)
            m_.count(packing, "pad_id", bad, where="packing.")
            _packing_record(packing, bad, where="packing.")
            for name, split in m["splits"].items():
                for shard in split["shards"]:
                    m_.file_entry(shard.get("boundaries"), bad, f"splits.{name}.shards[].boundaries")
        chat = m_.need(m, "chat", dict, bad, optional=True, nullable=True)
        if chat is not None:
            _check_chat(chat, bad)
        nanogpt = m_.need(m, "nanogpt", dict, bad, optional=True, nullable=True)
        for split, entry in (nanogpt or {}).items():
            if entry is not None:  # a split without tokens has no nanoGPT file
                m_.file_entry(entry, bad, f"nanogpt.{split}")

    def side_files(self, manifest: dict[str, Any]) -> list[str]:
        tok = manifest.get("tokenizer")
        return [tok["path"]] if isinstance(tok, dict) and isinstance(tok.get("path"), str) else []

    def verify_files(self, read: Any, manifest: dict[str, Any], *, failed: set[str]) -> list[str]:
        """The tokenizer against its sha256 when ``files`` does not list it (manifests written before
        ``files`` was recorded, or a list cut short)."""
        tok = manifest["tokenizer"]
        if tok["path"] in {e["path"] for e in manifest.get("files") or []}:
            return []
        try:
            if hashlib.sha256(read(tok["path"])).hexdigest() != tok["sha256"]:
                return [f"{tok['path']}: sha256 differs from the manifest's tokenizer.sha256"]
        except OSError as exc:
            return [f"{tok['path']}: cannot read ({exc.strerror or exc})"]
        except DatasetError as exc:
            return [str(exc)]
        return []

    def split_files(self, manifest: dict[str, Any]) -> list[dict[str, Any]]:
        """nanoGPT's flat ``{split}.bin`` files (``--nanogpt``), hashed as they were written."""
        return [e for e in (manifest.get("nanogpt") or {}).values() if isinstance(e, dict)]

    def writer(self, job: WriteJob, split: str, part: ShardRange) -> Writer:
        from shardsmith.formats.tokens.writer import TokensWriter

        o = job.options
        if o.pack is not None:
            return _packed_writer(job, split, part)
        return TokensWriter(out_dir=job.out, split=split, dtype=job.schema, shard_tokens=o.shard_tokens,
                            nanogpt=o.nanogpt, provenance=o.provenance, part=part)

    def split_fields(self, job: WriteJob, split: str, output: Any) -> dict[str, Any]:
        fields = {"tokens": sum(s.extra["tokens"] for s in output.shards)}
        if job.options.pack is not None:
            from shardsmith.formats.tokens.packed import packing_stats

            fields["packing"] = packing_stats([s.extra for s in output.shards], seq_len=job.options.seq_len)
        return fields

    def manifest_fields(self, job: WriteJob, outputs: dict[str, Any]) -> dict[str, Any]:
        """The options' values where the manifests have always held them (``options.py``: not recorded
        again as ``format_options``): nanoGPT's files, the packing; ``seq_len`` is the job's (``extras``)."""
        o = job.options
        fields: dict[str, Any] = {}
        if o.nanogpt:
            fields["nanogpt"] = {name: out.flat_record for name, out in outputs.items()}
        if o.pack is not None:
            from shardsmith.formats.tokens.packed import packing_stats

            extras = [s.extra for out in outputs.values() for s in out.shards]
            fields["packing"] = {"method": o.pack, "seq_len": o.seq_len, "pad_id": o.pad_id,
                                 "window_tokens": o.pack_window, **packing_stats(extras, seq_len=o.seq_len)}
        return fields

    def card(self, out: Path, manifest: dict[str, Any]) -> CardData:
        """``datasets`` reads no token shards: the card describes them (``formats/tokens/card.py``)."""
        from shardsmith.formats.tokens.card import tokens_card

        return tokens_card(manifest)

    def open(self, out_dir: str | Path, *, split: str, decode: str | None = None) -> Any:
        from shardsmith.formats.tokens.dataset import TokenDocuments
        from shardsmith.formats.tokens.packed import PackedSequences
        from shardsmith.kit.dataset_files import files_for

        files = files_for(out_dir)  # a folder, or the files object ``loader.open`` passes (a URL's too)
        kind = TokenDocuments if files.load_manifest().get("packing") is None else PackedSequences
        return kind(files, split=split)

    def verify_deep(self, out: Path, manifest: dict[str, Any], split: str) -> list[str]:
        """Every token inside the vocabulary (``verify_layout`` has checked each index). ``out``: a folder,
        or the files of a dataset at a URL (each shard fetched whole, as the loader does)."""
        import os

        from shardsmith.kit.dataset_files import files_for

        problems = []
        vocab = manifest["tokenizer"]["vocab_size"]
        dtype = safe_dtype(manifest["tokenizer"]["dtype"], field="tokenizer.dtype")
        files = files_for(out)
        _, shards = files.load_split(fmt="tokens", split=split)
        for s, shard in enumerate(shards):
            try:
                tokens = np.zeros(0, dtype)
                if shard["bytes"]:
                    with os.fdopen(files.open(s), "rb") as fh:
                        tokens = np.memmap(fh, dtype=dtype, mode="r")
                for start in range(0, len(tokens), 1 << 24):
                    chunk = tokens[start:start + (1 << 24)]
                    if len(chunk) and (int(chunk.max()) >= vocab or int(chunk.min()) < 0):
                        bad = start + int(np.flatnonzero((chunk >= vocab) | (chunk < 0))[0])
                        problems.append(f"{shard['path']}: token {int(tokens[bad])} at position {bad} is outside "
                                        f"the vocabulary of {vocab}")
                        break
            except DatasetError as exc:
                problems.append(str(exc))
        return problems

    @staticmethod
    def _index_problems(files: Any, shards: list[dict[str, Any]], dtype: np.dtype) -> list[str]:
        """Each shard's ``.idx`` parsed as the loader parses it, against the manifest (documents, dtype)."""
        from shardsmith.formats.tokens.indexed import parse_idx

        problems = []
        for shard in shards:
            index = shard["index"]
            try:
                idx = parse_idx(files.sidecar(index), files.name_of(index["path"]), bin_bytes=shard["bytes"])
            except (DatasetError, OSError) as exc:
                problems.append(str(exc))
                continue
            if len(idx.lengths) != shard["samples"]:
                problems.append(f"{index['path']}: {len(idx.lengths)} documents, the manifest says {shard['samples']}")
            if idx.dtype != dtype:
                problems.append(f"{index['path']}: dtype {idx.dtype}, the manifest says {dtype}")
        return problems

    def verify_layout(self, out: Path, manifest: dict[str, Any], split: str) -> list[str]:
        """Every shard's ``.idx`` (small: 12 bytes a document); with ``--provenance``: every shard's
        origins, one row per document (per piece, packed); with ``--chat``: every shard's loss bits."""
        from shardsmith.formats.tokens.masks import verify_masks
        from shardsmith.formats.tokens.origins import has_origins, verify_origins
        from shardsmith.kit.dataset_files import files_for

        dtype = safe_dtype(manifest["tokenizer"]["dtype"], field="tokenizer.dtype")
        shards = manifest["splits"][split]["shards"]
        problems = self._index_problems(files_for(out), shards, dtype)
        problems += verify_origins(out, manifest, split) if has_origins(manifest) else []
        if manifest.get("chat") is not None:
            problems += verify_masks(files_for(out), shards, dtype)
        return problems

    def describe(self, out: Path, manifest: dict[str, Any]) -> dict[str, Any]:
        from shardsmith.formats.tokens.origins import has_origins

        described: dict[str, Any] = {"tokenizer": manifest["tokenizer"]}
        lines = []
        if (chat := manifest.get("chat")) is not None:
            described["chat"] = chat
            lines.append(f"chat: {plural(chat['conversations'], 'conversation')} through the chat template, the loss "
                         f"on {chat['trained_tokens']:,} of {plural(chat['tokens'], 'token')} "
                         f"({100 * chat['trained_fraction']:.1f} %, --train-on {chat['train_on']}); loss bits "
                         f"beside each shard (.mask.bin)")
        if has_origins(manifest):
            described["provenance"] = True
            lines.append("provenance: every document's input, line or row and byte offset beside each "
                         "shard (shardsmith trace OUT INDEX)")
        if lines:
            described["format_lines"] = lines
        return described

    def report(self, out: Path, manifest: dict[str, Any], sampling: Any) -> list[Any]:
        """Document lengths, tokens per shard, the most frequent tokens, documents cut, padding."""
        from shardsmith.formats.tokens.report import token_sections

        return token_sections(out, manifest, sampling)

    def show(self, out: Path, manifest: dict[str, Any], n: int) -> list[dict[str, Any]]:
        """The first documents: their length, first ids and decoded text."""
        from tokenizers import Tokenizer

        from shardsmith.formats.tokens.dataset import TokenDocuments

        split = first_split(manifest)
        if split is None or n == 0:
            return []
        docs = TokenDocuments(out, split=split)
        try:
            tok = _tokenizer(out, manifest, Tokenizer)
        except Exception:  # a damaged tokenizer.json (verify names it): show ids without text
            tok = None
        shown = []
        for i in range(min(n, len(docs))):
            ids = docs.tokens(i)
            text = tok.decode(ids.tolist(), skip_special_tokens=False) if tok else None
            shown.append({"split": split, "index": i, "tokens": len(ids), "ids": ids[:16].tolist(),
                          "text": text[:300] if text else text})
        return shown

    def bench(self, out: Path, *, split: str, seq_len: int | None, batch_size: int, seconds: float) -> Rate:
        """Shuffled random windows of ``seq_len`` tokens, in batches, in one process."""
        from shardsmith.formats.tokens.dataset import TokenDataset

        m = manifest_io.load(out)
        ds = TokenDataset(out, seq_len=seq_len or m.get("seq_len") or 1024, split=split, windows_of_chat=True)
        if len(ds) < 1:
            raise DatasetError(f"{out}: split {split!r} holds fewer than seq_len+1 tokens")
        size = min(batch_size, len(ds))
        it = ds.iter(shuffle=True, seed=0, batch_size=size)
        batches = 0
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            try:
                next(it)
            except StopIteration:
                it = ds.iter(shuffle=True, seed=0, epoch=batches + 1, batch_size=size)
                continue
            batches += 1
        elapsed = time.perf_counter() - t0
        tokens_per_s = batches * size * ds.seq_len / elapsed
        return Rate(tokens_per_s, "tokens/s",
                    f"{out} [{split}]: {batches / elapsed:,.0f} batches/s of {batch_size}×{ds.seq_len}, "
                    f"{tokens_per_s / 1e6:,.1f} M tokens/s (shuffled random windows, one process)")


def _packing_record(packing: Any, bad: Any, *, where: str) -> None:
    """The figures of a packing (``packing_stats``, and the window it packed in): counts and shares."""
    if not isinstance(packing, dict):
        if packing is not None:
            raise bad(f"{where[:-1]!r} must be an object")
        return
    for key in ("window_tokens", "sequences", "real_tokens", "padding_tokens", "documents", "documents_split"):
        m_.count(packing, key, bad, where=where, optional=True)
    for key in ("padding_fraction", "split_fraction"):
        m_.fraction(packing, key, bad, where=where, optional=True)


def _check_chat(chat: dict[str, Any], bad: Any) -> None:
    """The ``chat`` record's fields that inspect and the report read, each typed."""
    for key in ("conversations", "tokens", "trained_tokens", "truncated", "truncated_tokens", "dropped_too_long",
                "dropped_tokens"):
        m_.count(chat, key, bad, where="chat.")
    fraction = m_.need(chat, "trained_fraction", (int, float), bad, where="chat.")
    if not 0 <= fraction <= 1:
        raise bad(f"'chat.trained_fraction' is {fraction}, out of [0, 1]")
    for key in ("train_on", "template_sha256"):
        m_.need(chat, key, str, bad, where="chat.")
    m_.need(chat, "too_long", str, bad, where="chat.", nullable=True)
    m_.need(chat, "generation_blocks", bool, bad, where="chat.")
    for n in m_.need(chat, "messages", dict, bad, where="chat.").values():
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise bad("'chat.messages' counts conversations by messages: whole numbers")


def _packed_writer(job: WriteJob, split: str, part: ShardRange) -> Writer:
    from shardsmith.formats.tokens.packed_writer import PackedTokensWriter

    o = job.options
    return PackedTokensWriter(out_dir=job.out, split=split, dtype=job.schema, shard_tokens=o.shard_tokens,
                              seq_len=o.seq_len, pad_id=o.pad_id, window_tokens=o.pack_window,
                              provenance=o.provenance, part=part)


def _tokenizer(out: Any, manifest: dict[str, Any], kind: Any) -> Any:
    """The dataset's tokenizer (None if absent): the file in a folder; of a dataset at a URL, fetched
    by its entry in the manifest's ``files`` (size and sha256 checked)."""
    from shardsmith.kit.dataset_files import files_for

    files, rel = files_for(out), manifest["tokenizer"]["path"]
    if not files.streamed:
        path = manifest_mod.resolve_inside(out, rel)
        return kind.from_file(str(path)) if path.is_file() else None
    entry = next((e for e in manifest.get("files") or [] if e.get("path") == rel), None)
    return None if entry is None else kind.from_str(files.sidecar(entry).decode())
