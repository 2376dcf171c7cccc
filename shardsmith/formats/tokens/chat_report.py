"""The report's section of a chat dataset (``pack-tokens --chat``): conversation lengths, messages
(turns) per conversation, and the share of tokens the loss counts, per conversation (from the loss bits of the
report's sample of conversations) and in all (from the manifest)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from shardsmith.core import manifest as manifest_mod
from shardsmith.core.words import plural
from shardsmith.formats.tokens.masks import bits_of
from shardsmith.kit.sections import figures
from shardsmith.kit.sections.model import SUMMARY_HEADER, Section, Table, summary_row
from shardsmith.text.chat import MESSAGE_BINS


def shard_bits(out: Path, shard: dict[str, Any], tokens: int) -> np.ndarray | None:
    """A shard's loss bits (None when the sidecar is missing or of the wrong size: verify names it)."""
    try:
        data = manifest_mod.resolve_inside(out, shard["mask"]["path"]).read_bytes()
    except (OSError, KeyError, TypeError, ValueError):
        return None
    return bits_of(data, tokens)


def chat_section(out: Path, manifest: dict[str, Any], shards: list[dict[str, Any]],
                 spans: list[tuple[int, np.ndarray, np.ndarray]], itemsize: int) -> Section:
    """``spans``: (shard, first token, length) of the sampled conversations (or packed pieces)."""
    chat = manifest["chat"]
    lengths, shares, trained = [], [], []
    for k, starts, lens in spans:
        bits = shard_bits(out, shards[k], int(shards[k]["bytes"]) // itemsize)
        if bits is None or not len(lens):
            continue
        running = np.concatenate([[0], np.cumsum(bits, dtype=np.int64)])
        on = running[starts + lens] - running[starts]
        lengths.append(lens)
        trained.append(on)
        shares.append(on / np.maximum(lens, 1))
    lens = np.concatenate(lengths) if lengths else np.zeros(0, np.int64)
    on = np.concatenate(trained) if trained else np.zeros(0, np.int64)
    share = np.concatenate(shares) if shares else np.zeros(0)
    section = Section(title="Conversations")
    packed = manifest.get("packing") is not None
    section.notes.append(
        f"{plural(chat['conversations'], 'conversation')} rendered with the chat template (sha256 "
        f"{chat['template_sha256'][:12]}; {'its {% generation %} blocks' if chat['generation_blocks'] else 'turn by turn'}"
        f" mark the assistant's tokens); the loss counts --train-on {chat['train_on']}: "
        f"{chat['trained_tokens']:,} of their {plural(chat['tokens'], 'token')} ({100 * chat['trained_fraction']:.1f} %"
        f"). Per conversation: {len(lens):,} of them from the report's sample"
        + (" (pieces, where a conversation was split across sequences)." if packed else "."))
    section.tables.append(Table(caption="Per conversation", header=SUMMARY_HEADER, rows=[
        summary_row("conversation length", lens, "tokens"), summary_row("tokens trained on", on, "tokens"),
        summary_row("share trained on", share, "")]))
    rows = [("conversations", f"{chat['conversations']:,}"),
            ("tokens trained on", f"{chat['trained_tokens']:,} ({100 * chat['trained_fraction']:.2f} %)")]
    if chat.get("too_long"):
        rows += [(f"longer than --seq-len: {chat['too_long']}", f"{chat['truncated'] + chat['dropped_too_long']:,}"),
                 ("their tokens cut or left out", f"{chat['truncated_tokens'] + chat['dropped_tokens']:,}")]
    section.tables.append(Table(caption="In all (from the manifest)", header=("what", "count"), rows=rows))
    turns = chat.get("messages") or {}
    if turns:
        keys = sorted(turns, key=int)
        labels = [k if int(k) < MESSAGE_BINS else f"{k}+" for k in keys]
        section.tables.append(Table(caption="Messages per conversation", header=("messages", "conversations"),
                                    rows=[(label, f"{turns[k]:,}") for label, k in zip(labels, keys)]))
        section.figures.append(figures.bar("chat-turns", title="Messages per conversation", labels=labels,
                                           values=[turns[k] for k in keys], xlabel="messages",
                                           ylabel="conversations"))
    if len(lens):
        section.figures.append(figures.hist("chat-lengths", title="Conversation lengths", values=lens,
                                            xlabel="length (tokens, log scale)", ylabel="conversations", log_x=True))
        section.figures.append(figures.hist("chat-trained-share", title="Share of each conversation trained on",
                                            values=share, xlabel="tokens the loss counts / tokens",
                                            ylabel="conversations"))
    return section
