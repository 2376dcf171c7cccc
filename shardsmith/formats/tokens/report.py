"""The report of token datasets (``pack-tokens``): document lengths, tokens per shard, the most
frequent tokens (decoded with the dataset's own ``tokenizer.json``), the share of documents longer
than ``--seq-len``, and for packed datasets the padding. Lengths come from the ``.idx`` files (or a
packed shard's document boundaries) of a seeded sample of shards; token counts from a seeded
sample of documents in them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from shardsmith.core import manifest as manifest_mod
from shardsmith.core.dtypes import safe_dtype
from shardsmith.core.words import plural
from shardsmith.formats.tokens.boundaries import read_boundaries
from shardsmith.formats.tokens.indexed import read_idx
from shardsmith.kit.dataset_files import files_for
from shardsmith.kit.sections import figures
from shardsmith.kit.sections.model import SUMMARY_HEADER, Sampling, Section, Table, summary_row

TOP = 30  # most frequent tokens drawn (50 in the table)


def token_sections(out: Path, manifest: dict[str, Any], sampling: Sampling) -> list[Section]:
    tok = manifest["tokenizer"]
    dtype = safe_dtype(tok["dtype"], field="tokenizer.dtype")
    packing = manifest.get("packing")
    seq_len = sampling.seq_len or manifest.get("seq_len") or 1024
    shards = [(name, s) for name, split in manifest["splits"].items() for s in split["shards"]]
    order = sampling.rng(1).permutation(len(shards)) if shards else np.zeros(0, np.int64)
    taken, docs, lengths, spans = [], 0, [], []
    for k in order.tolist():  # a seeded sample of shards, up to max_documents documents
        if taken and (docs >= sampling.max_documents or sampling.late()):
            break
        starts, lens = _spans(out, shards[k][1], dtype, packing)
        taken.append(k)
        docs += len(lens)
        lengths.append(lens)
        spans.append((k, starts, lens))
    lens = np.concatenate(lengths) if lengths else np.zeros(0, np.int64)
    unit = "document pieces" if packing else "documents"
    per_shard = [int(s.get("tokens", s["bytes"] // dtype.itemsize)) for _, s in shards]
    section = Section(title="Tokens")
    section.notes.append(f"Lengths of {plural(len(lens), unit[:-1])} from {len(taken):,} of {plural(len(shards), 'shard')} "
                         f"({'all' if len(taken) == len(shards) else f'a seeded sample, seed {sampling.seed}'}).")
    if packing:
        section.notes.append("A packed dataset stores pieces of documents: a document cut across sequences counts "
                             "as its pieces here.")
    section.tables.append(Table(caption="Token counts", header=SUMMARY_HEADER, rows=[
        summary_row(f"{unit[:-1]} length", lens, "tokens"), summary_row("tokens per shard", np.asarray(per_shard), "tokens")]))
    section.figures.append(figures.hist("document-lengths", title=f"{unit[:-1].capitalize()} lengths", values=lens,
                                        xlabel="length (tokens, log scale)", ylabel=unit, log_x=True,
                                        mark=(seq_len, f"seq_len {seq_len}")))
    section.figures.append(figures.per_index("tokens-per-shard", title="Tokens per shard", values=per_shard,
                                             xlabel="shard (all splits, in order)", ylabel="tokens"))
    section.tables.append(_cut_table(manifest, lens, seq_len, packing))
    sections = [section]
    if manifest.get("chat") is not None:  # --chat: conversations and the tokens the loss counts
        from shardsmith.formats.tokens.chat_report import chat_section

        sections.append(chat_section(out, manifest, [s for _, s in shards], spans, dtype.itemsize))
    counts, counted = _counts(out, shards, spans, dtype, sampling)
    if counted:
        sections.append(_top_tokens(out, tok, counts, counted, sampling))
    return sections


def _spans(out: Path, shard: dict[str, Any], dtype: np.dtype, packing: Any) -> tuple[np.ndarray, np.ndarray]:
    """(first token, length) of each document (or packed piece) of a shard, in tokens."""
    if not packing:
        idx = read_idx(manifest_mod.resolve_inside(out, shard["index"]["path"]), bin_bytes=shard["bytes"])
        return idx.pointers // dtype.itemsize, idx.lengths
    seq_len = int(packing["seq_len"])
    ends = read_boundaries(files_for(out), shard["boundaries"], tokens=shard["bytes"] // dtype.itemsize)
    if not len(ends):
        return ends, ends
    prev = np.concatenate([[0], ends[:-1]])
    starts = np.maximum(prev, (ends - 1) // seq_len * seq_len)  # a piece never crosses a sequence; padding ends one
    return starts, ends - starts


def _cut_table(manifest: dict[str, Any], lens: np.ndarray, seq_len: int, packing: Any) -> Table:
    rows: list[tuple[Any, ...]] = []
    if packing:
        rows.append(("documents split across sequences", f"{packing.get('documents_split', 0):,} of "
                     f"{packing.get('documents', 0):,}", f"{float(packing.get('split_fraction', 0)):.2%}"))
        rows.append(("padding tokens", f"{packing.get('padding_tokens', 0):,} of "
                     f"{packing.get('padding_tokens', 0) + packing.get('real_tokens', 0):,}",
                     f"{float(packing.get('padding_fraction', 0)):.2%}"))
        for name, split in manifest["splits"].items():
            p = split.get("packing") or {}
            if p:
                rows.append((f"padding in split {name}", plural(p.get('padding_tokens', 0), 'token'),
                             f"{float(p.get('padding_fraction', 0)):.2%}"))
        return Table(caption=f"Packing into sequences of {packing['seq_len']:,} tokens", header=("what", "count", "share"),
                     rows=rows)
    longer = int((lens > seq_len).sum())
    over = int(np.maximum(lens - seq_len, 0).sum())
    rows.append((f"documents longer than seq_len {seq_len:,}", f"{longer:,} of {len(lens):,}",
                 f"{longer / max(len(lens), 1):.2%}"))
    rows.append(("their tokens past seq_len", f"{over:,} of {int(lens.sum()):,}", f"{over / max(int(lens.sum()), 1):.2%}"))
    return Table(caption=f"Documents cut at seq_len {seq_len:,} (from --seq-len, else the manifest's, else 1024)",
                 header=("what", "count", "share"), rows=rows)


def _counts(out: Path, shards: list[tuple[str, dict[str, Any]]], spans: list[tuple[int, np.ndarray, np.ndarray]],
            dtype: np.dtype, sampling: Sampling) -> tuple[tuple[np.ndarray, np.ndarray], int]:
    """(ids, counts) over a seeded sample of the documents of the sampled shards (``max_tokens`` at
    most: memory bounded by the sample, whatever the vocabulary's size)."""
    parts = []
    budget = max(1, sampling.max_tokens // max(len(spans), 1))
    for k, starts, lens in spans:
        if not len(lens) or sampling.late():
            continue
        ids = np.memmap(manifest_mod.resolve_inside(out, shards[k][1]["path"]), dtype=dtype, mode="r")
        order = sampling.rng(2 + k).permutation(len(lens))
        take = np.searchsorted(np.cumsum(lens[order]), budget) + 1
        parts.extend(np.array(ids[starts[d]:starts[d] + lens[d]]) for d in order[:take].tolist())
        del ids
    joined = np.concatenate(parts) if parts else np.zeros(0, dtype)
    return np.unique(joined, return_counts=True), len(joined)


def _top_tokens(out: Path, tok: dict[str, Any], found: tuple[np.ndarray, np.ndarray], counted: int,
                sampling: Sampling) -> Section:
    decode = _decoder(out, tok)
    ids, n = found
    order = np.argsort(-n, kind="stable")[:50]
    top, counts = ids[order].astype(np.int64), n[order]
    section = Section(title="Most frequent tokens")
    section.notes.append(f"Counted over {plural(counted, 'token')} of a seeded sample of documents (seed {sampling.seed}); "
                         f"decoded with the dataset's {tok['path']}" + ("" if decode else " (not readable: ids only)")
                         + ". Whitespace is shown as Python escapes (repr).")
    rows = [(i + 1, int(t), repr(decode(int(t))) if decode else "", int(c), f"{c / counted:.3%}")
            for i, (t, c) in enumerate(zip(top, counts))]
    section.tables.append(Table(caption="Most frequent tokens", header=("rank", "id", "token", "count", "share"),
                                rows=rows))
    shown = top[:TOP]
    section.figures.append(figures.bar("top-tokens", title=f"The {len(shown)} most frequent tokens",
                                       labels=[repr(decode(int(t))) if decode else str(int(t)) for t in shown],
                                       values=counts[:TOP] / counted * 100, xlabel="token (decoded)",
                                       ylabel="share of tokens (%)"))
    return section


def _decoder(out: Path, tok: dict[str, Any]) -> Any:
    """id -> text with the dataset's tokenizer, or None when it cannot be read (verify names why)."""
    try:
        from tokenizers import Tokenizer

        t = Tokenizer.from_file(str(manifest_mod.resolve_inside(out, tok["path"])))
    except Exception:
        return None
    def decode(i: int) -> str:
        try:
            return t.decode([i], skip_special_tokens=False) or (t.id_to_token(i) or "")
        except Exception:  # an id the tokenizer does not know (verify --deep names it)
            return f"<id {i}>"

    return decode
