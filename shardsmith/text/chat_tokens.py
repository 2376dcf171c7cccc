"""Rendered conversations into token ids and a loss mask, exactly as transformers makes them.

The ids are ``tokenizers``' ``encode(text, add_special_tokens=False)`` (what ``apply_chat_template``
tokenizes); a token is in the mask when its character offsets overlap a span, by transformers' own
walk over the tokens (``mask_from_offsets``). The reference engine asks ``tokenizers`` for the
offsets (~900 conversations of 700 tokens a second on a core). ``gigatoken`` gives the ids many
times faster but no offsets: for byte-level BPE they follow from the ids, as each token stands for
a fixed run of bytes (a table from gigatoken's vocabulary); the runs are made character offsets the
way tokenizers makes them (a token covers every character its bytes touch), then trimmed as the
post-processor trims them (``ByteLevel``'s ``trim_offsets``). That holds when the tokens' bytes
are the text's bytes, checked on every text (by counting them, or decoding where counting could be
fooled); a text where they are not (a normalizer changed it, a prefix space was added, an added
token took the spaces before it) is encoded by the reference instead.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

# Rust's char::is_whitespace (tokenizers trims these and the byte-level space "Ġ" from tokens' ends)
_RUST_WHITESPACE = ("\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009"
                    "\u200a\u2028\u2029\u202f\u205f\u3000")
_TRIMMED = "\u0120" + _RUST_WHITESPACE
ENGINES = ("gigatoken", "hf")
_FORMS = {"NFC", "NFD", "NFKC", "NFKD"}
_SPLITTERS = {"ByteLevel", "Split", "Digits", "Punctuation"}  # pre-tokenizers that only cut the text
_NEVER = np.iinfo(np.int64).max


def mask_from_offsets(offsets: np.ndarray, spans: Sequence[tuple[int, int]]) -> np.ndarray:
    """Which tokens (``offsets``: (n, 2) character offsets) overlap the spans, by transformers' rule
    in ``apply_chat_template``: one pointer walks the spans forward, past every span that ends at
    or before the token's start, and the token is in when it ends after that span's start."""
    offsets = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
    return _mask(offsets[:, 0], offsets[:, 1], spans)


def _mask(starts: np.ndarray, ends: np.ndarray, spans: Sequence[tuple[int, int]], *,
          ordered: bool = False) -> np.ndarray:
    """``mask_from_offsets``; ``ordered``: the starts never decrease (then so does the pointer)."""
    if len(spans) == 0 or len(starts) == 0:
        return np.zeros(len(starts), dtype=bool)
    span_start = [int(a) for a, _ in spans]
    span_end = [int(b) for _, b in spans]
    if any(b < a for a, b in zip(span_end, span_end[1:])):
        return _mask_walk(starts, ends, span_start, span_end)
    # with the span ends in order, the pointer after a token is the first span ending after its
    # start, or after an earlier token's (a pointer never moves back): a running maximum
    at = np.searchsorted(span_end, starts, side="right")
    if not ordered:
        np.maximum.accumulate(at, out=at)
    span_start.append(_NEVER)  # a pointer past the last span: no token is in
    return ends > np.array(span_start, dtype=np.int64)[at]


def _mask_walk(starts: np.ndarray, ends: np.ndarray, span_start: list[int], span_end: list[int]) -> np.ndarray:
    """The walk itself, for spans whose ends are out of order (nested generation blocks)."""
    mask = np.zeros(len(starts), dtype=bool)
    at, n = 0, len(span_start)
    for i, (start, end) in enumerate(zip(starts.tolist(), ends.tolist())):
        while at < n and start >= span_end[at]:
            at += 1
        if at == n:
            break
        mask[i] = end > span_start[at]
    return mask


def _walk(node: Any, kind: str) -> list[dict]:
    """``node`` and the members of its Sequences, in order, as dicts (tokenizer.json's parts)."""
    if not isinstance(node, dict):
        return []
    if node.get("type") == "Sequence":
        return [m for sub in node.get(kind, []) for m in _walk(sub, kind)]
    return [node]


@dataclass(frozen=True)
class OffsetPlan:
    """How offsets follow from ids for one tokenizer.json. ``trims``: the ``add_prefix_space`` of
    each post-processor that trims offsets, in order; ``forms``: the Unicode normal forms its
    normalizer applies (a text already in them is unchanged; () without a normalizer);
    ``decode``: a text's bytes must be checked by decoding its ids, not by counting them."""

    trims: tuple[bool, ...]
    forms: tuple[str, ...]
    decode: bool


def offset_plan(spec: dict) -> OffsetPlan | None:
    """The plan for a byte-level BPE tokenizer.json; None when offsets cannot be derived from its ids."""
    model = spec.get("model") or {}
    if (model.get("type", "BPE") != "BPE" or model.get("byte_fallback") or model.get("continuing_subword_prefix")
            or model.get("end_of_word_suffix")):
        return None
    pre = _walk(spec.get("pre_tokenizer"), "pretokenizers")
    if not any(p.get("type") == "ByteLevel" for p in pre):
        return None
    trims: list[bool] = []
    for proc in _walk(spec.get("post_processor"), "processors"):
        kind = proc.get("type")
        if kind in ("ByteLevel", "RobertaProcessing"):
            if proc.get("trim_offsets", True):
                trims.append(bool(proc.get("add_prefix_space", True)))
        elif kind not in ("TemplateProcessing", "BertProcessing"):  # these move no offsets without specials
            return None
    forms = tuple(n.get("type") for n in _walk(spec.get("normalizer"), "normalizers"))
    # counting the tokens' bytes proves them the text's unless bytes can be both added (a prefix
    # space, an unknown token's text) and dropped (spaces an added token strips, a pre-tokenizer
    # that removes what it splits at): then only a decode does
    split_only = all(p.get("type") in _SPLITTERS and p.get("behavior") != "Removed" for p in pre)
    adds = (not split_only or model.get("unk_token") is not None
            or any(p.get("type") == "ByteLevel" and p.get("add_prefix_space", True) for p in pre))
    drops = not split_only or any(t.get("lstrip") or t.get("rstrip") for t in spec.get("added_tokens") or [])
    return OffsetPlan(trims=tuple(trims), forms=forms if set(forms) <= _FORMS else (),
                      decode=not set(forms) <= _FORMS or (adds and drops))


class _ByteTable:
    """Per token id, from gigatoken's vocabulary (the bytes its decode gives): how many bytes, how
    many characters start in them, whether the first byte continues a character; and how many
    characters tokenizers' trim takes off each end of the token's string."""

    def __init__(self, *, spec: dict, giga: Any, trims: tuple[bool, ...]) -> None:
        vocab = giga.vocab
        size = max(int(giga.vocab_size), max(vocab, default=-1) + 1)
        tids = np.fromiter(vocab.keys(), np.int64, len(vocab))
        lens = np.fromiter(map(len, vocab.values()), np.int64, len(vocab))
        starts = np.cumsum(lens) - lens
        begins = (np.frombuffer(b"".join(vocab.values()), np.uint8) & 0xC0) != 0x80  # a character's first byte
        counted = np.concatenate([[0], np.cumsum(begins)])
        self.lengths = np.zeros(size, dtype=np.int64)
        self.lengths[tids] = lens
        self.chars = np.zeros(size, dtype=np.int64)
        self.chars[tids] = counted[starts + lens] - counted[starts]
        self.continues = np.zeros(size, dtype=np.int64)
        self.continues[tids] = (lens > 0) & ~np.append(begins, True)[np.minimum(starts, len(begins))]
        self.has_empty = not self.lengths.all()
        self.lead = self.trail = np.zeros(0, dtype=np.int64)
        if trims:
            strings = {v: k for k, v in (spec.get("model", {}).get("vocab") or {}).items()}
            strings.update((int(t["id"]), t["content"]) for t in spec.get("added_tokens") or [])
            self.lead = np.zeros(size, dtype=np.int64)
            self.trail = np.zeros(size, dtype=np.int64)
            for tid, s in strings.items():
                if 0 <= tid < size and s and (s[0] in _TRIMMED or s[-1] in _TRIMMED):
                    self.lead[tid] = len(s) - len(s.lstrip(_TRIMMED))
                    self.trail[tid] = len(s) - len(s.rstrip(_TRIMMED))


def _trim(starts: np.ndarray, ends: np.ndarray, lead: np.ndarray, trail: np.ndarray,
          add_prefix_space: bool) -> tuple[np.ndarray, np.ndarray]:
    """tokenizers' ``process_offsets``: a token's leading and trailing spaces leave its offsets
    (within them), except the one space of a first token that ``add_prefix_space`` may have added."""
    if add_prefix_space:
        first = starts == 0
        first[0] = True
        lead = np.where(first & (lead == 1), 0, lead)
    starts = np.where(lead > 0, np.minimum(starts + lead, ends), starts)
    ends = np.where((trail > 0) & (ends >= trail), np.maximum(ends - trail, starts), ends)
    return starts, ends


class ChatEncoder:
    """Ids and a loss mask per conversation; the ids equal tokenizers' ``encode(text,
    add_special_tokens=False)`` and the mask transformers' rule over the spans. ``engine``: "hf"
    (tokenizers' offsets, the reference) or "gigatoken" (ids from gigatoken, offsets from its
    byte table; the reference for any text or tokenizer that table does not fit); ``loaded``: a
    ``gigatoken.Tokenizer`` of this file already built. One text at a time: workers are forked,
    and tokenizers' batch calls would start thread pools."""

    def __init__(self, *, tokenizer_json: str, engine: str, loaded: Any = None) -> None:
        if engine not in ENGINES:
            raise ValueError(f"engine must be one of {ENGINES}, not {engine!r}")
        self._json = tokenizer_json
        self._hf_loaded: Any = None  # the reference, loaded when a text needs it (gigatoken: rarely)
        self._giga: Any = None
        self._table: _ByteTable | None = None
        self._plan: OffsetPlan | None = None
        self.by_reference = 0  # texts the gigatoken engine handed to the reference
        if engine == "gigatoken":
            spec = json.loads(tokenizer_json)
            self._plan = offset_plan(spec)
            if self._plan is not None:
                import gigatoken

                self._giga = loaded if loaded is not None else gigatoken.Tokenizer.from_json(tokenizer_json)
                self._table = _ByteTable(spec=spec, giga=self._giga, trims=self._plan.trims)

    @property
    def derives_offsets(self) -> bool:
        """Whether texts are encoded by gigatoken with offsets from its byte table (else all by tokenizers)."""
        return self._table is not None

    def encode(self, texts: list[str], spans: list[Sequence[tuple[int, int]]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ids int64 flat, mask bool flat, token count per text int64)."""
        if len(texts) != len(spans):
            raise ValueError(f"{len(texts)} texts but {len(spans)} span lists")
        all_ids, all_masks = [], []
        lengths = np.zeros(len(texts), dtype=np.int64)
        for i, (text, text_spans) in enumerate(zip(texts, spans)):
            got = self._derived(text) if self._table is not None else None
            if got is None:
                ids, starts, ends = self._reference(text)
                all_masks.append(_mask(starts, ends, text_spans))
            else:
                ids, starts, ends = got
                all_masks.append(_mask(starts, ends, text_spans, ordered=True))
            all_ids.append(ids)
            lengths[i] = len(ids)
        if not texts:
            return np.zeros(0, np.int64), np.zeros(0, bool), lengths
        return np.concatenate(all_ids), np.concatenate(all_masks), lengths

    @property
    def _hf(self) -> Any:
        if self._hf_loaded is None:
            from tokenizers import Tokenizer

            self._hf_loaded = Tokenizer.from_str(self._json)
            self._hf_loaded.no_truncation()
            self._hf_loaded.no_padding()
        return self._hf_loaded

    def _reference(self, text: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        enc = self._hf.encode(text, add_special_tokens=False)
        offsets = np.array(enc.offsets, dtype=np.int64).reshape(-1, 2)
        return np.array(enc.ids, dtype=np.int64), offsets[:, 0], offsets[:, 1]

    def _derived(self, text: str) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """(ids, start and end characters) from gigatoken's ids; None when the tokens' bytes may
        not be the text's bytes (then the reference encodes it)."""
        table, plan = self._table, self._plan
        ids = self._giga.encode(text)
        if not len(ids):
            return None if text else (np.zeros(0, np.int64),) * 3
        ascii_text = text.isascii()
        lens = table.lengths[ids]
        # the tokens' bytes are the text's when as many: nothing but the normalizer or the
        # pre-tokenizer adds bytes (a prefix space), only added tokens that strip spaces drop some
        same = int(lens.sum()) == (len(text) if ascii_text else len(text.encode("utf-8")))
        if same and plan.decode:
            same = self._giga.decode(ids) == text.encode("utf-8")
        elif same and plan.forms and not ascii_text:
            same = all(unicodedata.is_normalized(form, text) for form in plan.forms)
        if not same or (table.has_empty and not lens.all()):
            self.by_reference += 1
            return None
        chars = table.chars[ids]  # a token covers every character its bytes touch
        ends = np.cumsum(chars)
        starts = ends - chars - table.continues[ids]
        for add_prefix_space in plan.trims:
            starts, ends = _trim(starts, ends, table.lead[ids], table.trail[ids], add_prefix_space)
        return ids.astype(np.int64), starts, ends
