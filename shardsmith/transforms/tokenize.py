"""Tokenizing documents with a HuggingFace ``tokenizer.json``, on the fastest engine that gives the same ids.

``tokenizers`` is the reference. ``gigatoken`` encodes byte-level BPE files with identical ids
many times faster; it is used only after it matched ``tokenizers`` on a sample of the actual
input (plus a few awkward probes), so the output never depends on the engine.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np

from shardsmith.errors import UsageError
from shardsmith.writers.tokens import token_dtype

EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>", "<|eot_id|>", "<|im_end|>", "[SEP]",
                  "<|eos|>", "<EOS>")
ENGINES = ("auto", "hf", "gigatoken")
_PROBES = ["", " ", "  leading spaces", "trailing  ", "line\nbreak\r\nand\ttab", "ünïcödé — 日本語 🤖",
           "<|endoftext|> inside text </s> [SEP]", "numbers 1234567890 3.14159", "'s 've 're CAPS"]


@dataclass(frozen=True, slots=True)
class TokenizerSpec:
    """Everything a worker needs to encode exactly as the parent decided: picklable, no live objects."""

    json: str
    engine: str
    eos_id: int | None
    bos_id: int | None
    vocab_size: int

    @property
    def dtype(self) -> np.dtype:
        return token_dtype(self.vocab_size)


def load_hf(path: str | Path) -> tuple[Any, str, str]:
    """(tokenizer with truncation and padding off, its JSON, sha256 of the file as given)."""
    from tokenizers import Tokenizer

    p = Path(path)
    if not p.is_file():
        raise UsageError(f"--tokenizer: {path}: no such file")
    raw = p.read_bytes()
    try:
        tok = Tokenizer.from_str(raw.decode("utf-8"))
    except Exception as exc:  # tokenizers raises plain Exception subclasses from Rust
        raise UsageError(f"--tokenizer: {path}: not a HuggingFace tokenizer.json ({str(exc)[:200]})") from None
    return _plain(tok), tok.to_str(), hashlib.sha256(raw).hexdigest()


def _plain(tok: Any) -> Any:
    """Switch off the tokenizer's own truncation and padding (sentence-transformers files carry both)."""
    tok.no_truncation()
    tok.no_padding()
    return tok


def special_id(tok: Any, token: str, option: str) -> int:
    tid = tok.token_to_id(token)
    if tid is None:
        raise UsageError(f"{option}: {token!r} is not in the tokenizer's vocabulary")
    return int(tid)


def default_eos(tok: Any) -> str | None:
    """The first usual end-of-text token among the tokenizer's special tokens."""
    specials = {t.content for t in tok.get_added_tokens_decoder().values() if t.special}
    return next((c for c in EOS_CANDIDATES if c in specials), None)


def choose_engine(requested: str, tok: Any, json_text: str, sample: list[str]) -> tuple[str, str, Any]:
    """(engine, reason, loaded gigatoken tokenizer or None): gigatoken when it loads and matches
    tokenizers on the sample, else hf."""
    if requested == "hf":
        return "hf", "requested", None
    try:
        import gigatoken

        giga = gigatoken.Tokenizer.from_json(json_text)
    except Exception as exc:
        if requested == "gigatoken":
            raise UsageError(f"--engine gigatoken: gigatoken cannot load this tokenizer ({exc})") from None
        return "hf", f"gigatoken does not support this tokenizer ({str(exc)[:120]})", None
    texts = _PROBES + sample
    # one document at a time on both sides: batch encodes would start thread pools in this process,
    # and tokenizers then refuses parallelism in forked workers
    expected = [tok.encode(t, add_special_tokens=False).ids for t in texts]
    got = giga.encode_batch_list(texts, parallel=False)
    for text, want, have in zip(texts, expected, got):
        if list(have) != want:
            reason = f"gigatoken gave different ids than tokenizers for {text[:60]!r}"
            if requested == "gigatoken":
                raise UsageError(f"--engine gigatoken: {reason}")
            return "hf", reason, None
    return "gigatoken", f"matched tokenizers on {len(texts)} documents", giga


class Encoder:
    """Encodes batches of documents into one flat token array plus per-document lengths."""

    def __init__(self, spec: TokenizerSpec, *, loaded: Any = None) -> None:
        """``loaded``: the gigatoken tokenizer already built (and warmed) by ``choose_engine``."""
        self.spec = spec
        if spec.engine == "gigatoken":
            import gigatoken

            self._giga = loaded if loaded is not None else gigatoken.Tokenizer.from_json(spec.json)
        else:
            from tokenizers import Tokenizer

            self._hf = _plain(Tokenizer.from_str(spec.json))

    def encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(flat ids in the output dtype with bos/eos added, token count per document)."""
        if self.spec.engine == "gigatoken":
            layout = self._giga.encode_batch(texts).layout
            offsets = np.asarray(layout.offsets.data, dtype=np.int64)
            content = np.asarray(layout.content.data)
            if offsets[0]:
                content = content[offsets[0]:]
                offsets = offsets - offsets[0]
            raw_lengths = np.diff(offsets)
        else:
            ids = [e.ids for e in self._hf.encode_batch_fast(texts, add_special_tokens=False)]
            raw_lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
            content = np.fromiter(chain.from_iterable(ids), dtype=np.int64, count=int(raw_lengths.sum()))
        return _add_specials(content, raw_lengths, self.spec)


def _add_specials(content: np.ndarray, lengths: np.ndarray, spec: TokenizerSpec) -> tuple[np.ndarray, np.ndarray]:
    """Documents with their bos/eos ids, in the output dtype: the tokens go where a mask leaves
    room (a boolean mask, ten times faster here than an index per token)."""
    nb, ne = int(spec.bos_id is not None), int(spec.eos_id is not None)
    dtype = spec.dtype
    if not nb and not ne:
        return content.astype(dtype, copy=False), lengths
    new_lengths = lengths + nb + ne
    ends = np.cumsum(new_lengths)
    starts = ends - new_lengths
    out = np.empty(int(ends[-1]) if len(ends) else 0, dtype=dtype)
    room = np.ones(len(out), dtype=bool)
    if nb:
        room[starts] = False
    if ne:
        room[ends - 1] = False
    out[room] = content
    if nb:
        out[starts] = spec.bos_id
    if ne:
        out[ends - 1] = spec.eos_id
    return out, new_lengths


def train_bpe(texts: Iterable[str], *, vocab_size: int) -> str:
    """A byte-level BPE (GPT-2 style) with ``<|endoftext|>``, trained on the texts; returns its JSON."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    if vocab_size < 257 + 1:
        raise UsageError("--train-tokenizer: the vocabulary must hold the 256 bytes and <|endoftext|> (>= 258)")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<|endoftext|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok.to_str()
