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

Measured: ~0.2 s as threads, ~0.08 s now (the gigatoken side). The decision itself is
``text/engine_choice.py``'s, which the ``tokenize`` transform takes too.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from typing import Any

from shardsmith.engine.processes.forked import ForkedAnswer
from shardsmith.text.engine_choice import CUT_DOCS as _CUT_DOCS  # noqa: F401 (the check's constant, as before)
from shardsmith.text.engine_choice import decide_engine
from shardsmith.text.engine_choice import reference as _reference


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
    """``text.engine_choice.decide_engine`` with the reference's side in a forked child (this
    process computes it when the child fails, or where there is no fork)."""

    def start(texts: list[str], piece_texts: list[str]) -> Callable[[], dict[str, Any]]:
        child = _reference_in_child(tok, texts, piece_texts) if hasattr(os, "fork") else None

        def result() -> dict[str, Any]:
            ref = _answer(child) if child is not None else None
            if ref is None or len(ref["digests"]) != len(texts):
                ref = _reference(tok, texts, piece_texts, batch=False)
            return ref

        return result

    return decide_engine(requested, tok, json_text, sample, piece_docs=piece_docs, start_reference=start, tick=tick)
