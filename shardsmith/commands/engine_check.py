"""pack-tokens' engine check, both sides at once: the reference tokenizer (``tokenizers``) encodes
the check's texts in a forked child while this process builds gigatoken and encodes the same
texts; the two are compared by a digest of each text's ids.

Why a child: both sides are Rust that holds the GIL while it builds or encodes, so a thread ran
them one after the other (~0.2 s of a run's fixed cost on two cores); two processes run them at
once, and the check costs the longer side. The child also decides whether cutting documents into
pieces keeps their ids (``piece_safe``), in one batch call: its own thread pool, in a process
that ends at once, so no worker forked later inherits a used pool (tokenizers would then turn its
parallelism off there, with a warning). Where there is no fork, or the child fails, this process
computes the reference itself: the same decision, only slower.

Measured: ~0.2 s as threads, ~0.08 s now (the gigatoken side).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from shardsmith.core.words import plural
from shardsmith.engine.processes.forked import ForkedAnswer
from shardsmith.errors import UsageError
from shardsmith.text import tokenize as tk

_CUT_DOCS = 10  # sample documents cut into pieces of 48 characters: the engines must agree on pieces too


def _digest(ids: Any) -> str:
    return hashlib.blake2b(np.asarray(ids, dtype=np.int64).tobytes(), digest_size=16).hexdigest()


def _reference(tok: Any, texts: list[str], piece_texts: list[str], *, batch: bool) -> dict[str, Any]:
    """What the check needs from the reference: its ids' digest per text and ``piece_safe``.
    ``batch``: one ``encode_batch_fast`` call (a child's own thread pool), else one text at a time."""
    cases = tk.piece_cases(piece_texts)
    unique = list(dict.fromkeys([*texts, *(t for whole, cut in cases for t in (whole, *cut))]))
    if batch:
        encoded = [e.ids for e in tok.encode_batch_fast(unique, add_special_tokens=False)]
    else:
        encoded = [tok.encode(t, add_special_tokens=False).ids for t in unique]
    ids = dict(zip(unique, encoded))
    safe = all(ids[whole] == [i for piece in cut for i in ids[piece]] for whole, cut in cases)
    return {"safe": safe, "digests": [_digest(ids[t]) for t in texts]}


def _reference_in_child(tok: Any, texts: list[str], piece_texts: list[str]) -> ForkedAnswer:
    """``_reference`` in a forked child, sent back as JSON (nothing is unpickled)."""
    return ForkedAnswer(lambda: json.dumps(_reference(tok, texts, piece_texts, batch=True)).encode())


def _answer(child: ForkedAnswer) -> dict[str, Any] | None:
    """The child's reference, or None when it failed (the caller computes the reference itself)."""
    data = child.result()
    with contextlib.suppress(ValueError):
        got = json.loads(data) if data is not None else None
        if isinstance(got, dict) and isinstance(got.get("safe"), bool) and isinstance(got.get("digests"), list):
            return got
    return None


def check_engine(requested: str, tok: Any, json_text: str, sample: list[str], *, piece_docs: int,
                 tick: Callable[[int], Any] | None = None) -> tuple[str, str, bool, Any]:
    """(engine, reason, piece-safe, gigatoken tokenizer built here or None): gigatoken when it
    loads and gives the reference's ids on the probes, the sample and pieces of its first
    documents (when cutting is safe), else hf; ``--engine gigatoken`` that cannot is a usage
    error. ``piece_docs``: the sample documents the piece check cuts."""
    piece_texts = sample[:piece_docs]
    if requested == "hf":
        return "hf", "requested", tk.piece_safe(tok, piece_texts), None
    cut = [p for text in sample[:_CUT_DOCS] for p in (tk.pieces(text, 48) or [])]
    texts = [*tk.PROBES, *sample, *cut]
    child = _reference_in_child(tok, texts, piece_texts) if hasattr(os, "fork") else None
    giga, error = None, None
    try:
        import gigatoken

        giga = gigatoken.Tokenizer.from_json(json_text)
        mine = [_digest(giga.encode(t)) for t in texts]
    except Exception as exc:  # gigatoken raises plain exceptions from Rust
        error = exc
    ref = _answer(child) if child is not None else None
    if ref is None or len(ref["digests"]) != len(texts):
        ref = _reference(tok, texts, piece_texts, batch=False)
    if tick is not None:
        tick(len(texts))
    safe = ref["safe"]
    if error is not None:
        if requested == "gigatoken":
            raise UsageError(f"--engine gigatoken: gigatoken cannot load this tokenizer ({error})") from None
        return "hf", f"gigatoken does not support this tokenizer ({' '.join(str(error).split())})", safe, None
    checked = len(texts) if safe else len(texts) - len(cut)  # pieces only where cutting keeps the ids
    for text, want, got in zip(texts[:checked], ref["digests"], mine):
        if got != want:
            reason = f"gigatoken gave different ids than tokenizers for {text[:60]!r}"
            if requested == "gigatoken":
                raise UsageError(f"--engine gigatoken: {reason}")
            return "hf", reason, safe, None
    return "gigatoken", f"matched tokenizers on {plural(checked, 'document')}", safe, giga
