"""Which engine encodes a run's documents: gigatoken where it gives ``tokenizers``' ids on the
probes and a sample of the input (cut into pieces too, where cutting keeps the ids), else
``tokenizers``. One decision for every command that tokenizes: pack-tokens'
(``commands/engine_check.py`` runs the reference's side in a forked child, at once with
gigatoken's) and the ``tokenize`` transform's (``text/tokenize_rows.py``, the reference in process).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import numpy as np

from shardsmith.core.words import plural
from shardsmith.errors import UsageError
from shardsmith.text import tokenize as tk

SAMPLE_DOCS = 500  # the input's first documents the check encodes: at most this many,
SAMPLE_BYTES = 128 << 10  # this many characters in all,
SAMPLE_DOC_CHARS = 16 << 10  # and this many of each (any text is a probe: never a huge document whole)
PIECE_CHECK_DOCS = 40  # sample documents cut every few words to check that pieces keep the ids
CUT_DOCS = 10  # sample documents cut into pieces of 48 characters: the engines must agree on pieces too
# the reference's answer, started before gigatoken is built: (texts, piece texts) -> a call that
# gives {"safe": bool, "digests": [one per text]}
Reference = Callable[[list[str], list[str]], Callable[[], dict[str, Any]]]


def digest(ids: Any) -> str:
    return hashlib.blake2b(np.asarray(ids, dtype=np.int64).tobytes(), digest_size=16).hexdigest()


def reference(tok: Any, texts: list[str], piece_texts: list[str], *, batch: bool) -> dict[str, Any]:
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
    return {"safe": safe, "digests": [digest(ids[t]) for t in texts]}


def in_process(tok: Any) -> Reference:
    """The reference computed here, one text at a time (no thread pool for a forked worker to inherit)."""
    return lambda texts, piece_texts: lambda: reference(tok, texts, piece_texts, batch=False)


def decide_engine(requested: str, tok: Any, json_text: str, sample: list[str], *, piece_docs: int,
                  start_reference: Reference, tick: Callable[[int], Any] | None = None
                  ) -> tuple[str, str, bool, Any]:
    """(engine, reason, piece-safe, gigatoken tokenizer built here or None): gigatoken when it
    loads and gives the reference's ids on the probes, the sample and pieces of its first
    documents (when cutting is safe), else hf; ``--engine gigatoken`` that cannot is a usage
    error. ``piece_docs``: the sample documents the piece check cuts; ``start_reference``: how the
    reference's side runs (started before gigatoken's, which may run at the same time)."""
    piece_texts = sample[:piece_docs]
    if requested == "hf":
        return "hf", "requested", tk.piece_safe(tok, piece_texts), None
    cut = [p for text in sample[:CUT_DOCS] for p in (tk.pieces(text, 48) or [])]
    texts = [*tk.PROBES, *sample, *cut]
    answer = start_reference(texts, piece_texts)
    giga, error = None, None
    try:
        import gigatoken

        giga = gigatoken.Tokenizer.from_json(json_text)
        mine = [digest(giga.encode(t)) for t in texts]
    except Exception as exc:  # gigatoken raises plain exceptions from Rust
        error = exc
    ref = answer()
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
