"""Tokenizing documents with a HuggingFace ``tokenizer.json``, on the fastest engine that gives the same ids.

``tokenizers`` is the reference. ``gigatoken`` encodes byte-level BPE files with identical ids
many times faster; it is used only after it matched ``tokenizers`` on a sample of the actual
input (plus a few awkward probes), so the output never depends on the engine.

gigatoken encodes one document at a time in runs under ``BATCH_RUN_BYTES`` (256 MB) of input (its
batch calls import awkward, 0.2 s a process); larger runs use its batch call on the calling thread
(``parallel=False``: never a thread pool in a forked worker), ~5 instead of ~11 µs a document, with
the same ids (the spec's ``batch_chars``; the tests compare).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np

from shardsmith.core.dtypes import token_dtype
from shardsmith.core.side_file import TOKENIZER_LIMIT, read_side_file
from shardsmith.errors import UsageError

EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>", "<|eot_id|>", "<|im_end|>", "[SEP]",
                  "<|eos|>", "<EOS>")
ENGINES = ("auto", "hf", "gigatoken")
PROBES = ["", " ", "  leading spaces", "trailing  ", "line\nbreak\r\nand\ttab", "ünïcödé — 日本語 🤖",
           "<|endoftext|> inside text </s> [SEP]", "numbers 1234567890 3.14159", "'s 've 're CAPS"]
_LONG_PROBES = [" ".join(["The quick brown fox's 12 jumps, over the lazy dog!", "ünïcödé — 日本語 🤖 naïve",
                          "tabs\tand  double  spaces\nnew lines", "<|endoftext|> [SEP] </s> x"] * 6)]


PIECE_CHARS = 64 << 10  # documents longer than this are encoded in pieces of at most this many characters
GROUP_CHARS = 4 << 20  # pieces encoded in one call: the tokenizer's working memory stays bounded
BATCH_CHARS = 1 << 20  # gigatoken's batch call for batches of this much text, in runs of
BATCH_RUN_BYTES = 256 << 20  # this much input or more: the call imports awkward, ~0.2 s a process
_CHECK_PIECE = 48  # the engine check cuts its sample this small, to try many cuts


def pieces(text: str, size: int = PIECE_CHARS) -> list[str] | None:
    """``text`` cut into pieces of at most ``size`` characters, each cut at a single space between two
    characters that are not whitespace (no pre-token of byte-level BPE or WordPiece spans such a
    space, so the pieces' ids joined are the whole text's ids; ``piece_safe`` checks it for a given
    tokenizer); None when some stretch of ``size`` characters has no such space."""
    out: list[str] = []
    start, n = 0, len(text)
    while n - start > size:
        end = start + size
        cut = text.rfind(" ", start + 1, end)
        while cut > start and (text[cut - 1].isspace() or text[cut + 1].isspace()):
            cut = text.rfind(" ", start + 1, cut)
        if cut <= start:
            return None
        out.append(text[start:cut])
        start = cut
    out.append(text[start:])
    return out


def piece_cases(texts: list[str]) -> list[tuple[str, list[str]]]:
    """(text, its pieces) for the piece check: the probes and ``texts``, cut every few words (each
    that has a cut at all)."""
    out = []
    for text in [*PROBES, *_LONG_PROBES, *texts]:
        cut = pieces(text, _CHECK_PIECE)
        if cut is not None and len(cut) > 1:
            out.append((text, cut))
    return out


def piece_safe(tok: Any, texts: list[str]) -> bool:
    """Whether ``tok`` gives the same ids for texts cut by ``pieces`` as for them whole (tried on
    the probes and ``texts``, cut every few words), one text at a time."""

    def ids(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False).ids

    return all(ids(whole) == [i for piece in cut for i in ids(piece)] for whole, cut in piece_cases(texts))


def too_long(text: str, *, piece_chars: int | None) -> str | None:
    """Why a document cannot be encoded within bounded memory, or None."""
    if len(text) <= PIECE_CHARS:
        return None
    if piece_chars is None:
        return (f"a document of {len(text):,} characters is longer than the {PIECE_CHARS:,} this tokenizer "
                f"encodes at once, and it cannot be cut without changing its ids")
    if pieces(text, piece_chars) is None:
        return f"a document of {len(text):,} characters has a stretch of {piece_chars:,} without a space to cut at"
    return None


@dataclass(frozen=True, slots=True)
class TokenizerSpec:
    """Everything a worker needs to encode exactly as the parent decided: picklable, no live objects."""

    json: str
    engine: str
    eos_id: int | None
    bos_id: int | None
    vocab_size: int
    piece_chars: int | None = PIECE_CHARS  # long documents are encoded in pieces of this size (None: refused)
    batch_chars: int | None = None  # gigatoken's batch call from this much text a batch on (None: never)

    @property
    def dtype(self) -> np.dtype:
        return token_dtype(self.vocab_size)


@dataclass(frozen=True)
class LoadedTokenizer:
    """``tok``: the tokenizer (truncation and padding off); ``json``: it as tokenizers writes it;
    ``data``: the tokenizer.json the run encodes with and copies beside its dataset (the file's
    bytes, unless transformers builds another tokenizer from its folder: then ``json``'s); ``sha256``: of ``data``;
    ``built_as``: the class that built it (None: the file as it is)."""

    tok: Any
    json: str
    data: bytes
    sha256: str
    built_as: str | None


def load_hf(path: str | Path, *, what: str = "--tokenizer") -> LoadedTokenizer:
    """The tokenizer ``AutoTokenizer.from_pretrained`` makes of ``path``'s folder in transformers 5
    (``text/tokenizer_class.py``): the file as it is, or rebuilt by the class tokenizer_config.json
    names; a one-line usage error for a file that is no tokenizer.json or a class not reproduced
    (``what``: the option that named the file)."""
    from tokenizers import Tokenizer

    from shardsmith.text.tokenizer_class import built
    from shardsmith.text.tokenizer_folder import TokenizerFolder

    raw = tokenizer_bytes(path, what=what)
    try:
        Tokenizer.from_str(raw.decode("utf-8"))
    except Exception as exc:  # tokenizers raises plain Exception subclasses from Rust
        raise UsageError(f"{what}: {path}: not a HuggingFace tokenizer.json ({str(exc)[:200]})") from None
    made = built(TokenizerFolder.read(path), raw)
    tok = Tokenizer.from_str(made.data.decode("utf-8"))
    text = tok.to_str()
    data = made.data if made.built_as is None else text.encode("utf-8")  # a built one: as tokenizers writes it
    return LoadedTokenizer(tok=_plain(tok), json=text, data=data, sha256=hashlib.sha256(data).hexdigest(),
                           built_as=made.built_as)


def tokenizer_bytes(path: str | Path, *, what: str = "--tokenizer") -> bytes:
    """The tokenizer file's bytes, as given; a usage error when it is not a regular file of at most
    ``core/side_file.TOKENIZER_LIMIT`` bytes."""
    return read_side_file(path, what=what, limit=TOKENIZER_LIMIT)


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


class Encoder:
    """Encodes batches of documents into one flat token array plus per-document lengths."""

    def __init__(self, spec: TokenizerSpec, *, loaded: Any = None) -> None:
        """``loaded``: the gigatoken tokenizer already built (and warmed) by the engine check."""
        self.spec = spec
        if spec.engine == "gigatoken":
            import gigatoken

            self._giga = loaded if loaded is not None else gigatoken.Tokenizer.from_json(spec.json)
        else:
            from tokenizers import Tokenizer

            self._hf = _plain(Tokenizer.from_str(spec.json))

    def encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(flat ids in the output dtype with bos/eos added, token count per document). Documents
        longer than ``PIECE_CHARS`` are encoded in pieces (``pieces``), a bounded amount of text
        at a time; a caller refuses first those that ``too_long`` names."""
        if all(len(t) <= PIECE_CHARS for t in texts):
            content, raw_lengths = self._raw(texts)
            return _add_specials(content, raw_lengths, self.spec)
        units: list[str] = []
        owner: list[int] = []
        for i, t in enumerate(texts):
            cut = [t] if len(t) <= PIECE_CHARS else pieces(t, self.spec.piece_chars or PIECE_CHARS)
            if cut is None:
                raise ValueError(f"document {i} cannot be cut: refuse it first (too_long)")
            units += cut
            owner += [i] * len(cut)
        contents, lengths = [], []
        start = 0
        while start < len(units):  # groups of at most GROUP_CHARS characters (or one unit)
            end, chars = start, 0
            while end < len(units) and (end == start or chars + len(units[end]) <= GROUP_CHARS):
                chars += len(units[end])
                end += 1
            content, unit_lengths = self._raw(units[start:end])
            contents.append(content)
            lengths.append(unit_lengths)
            start = end
        unit_lengths = np.concatenate(lengths)
        raw_lengths = np.bincount(np.asarray(owner), weights=unit_lengths, minlength=len(texts)).astype(np.int64)
        return _add_specials(np.concatenate(contents), raw_lengths, self.spec)

    def _giga_batch(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """gigatoken's batch call on this thread (``parallel=False``: ``--workers`` is the cores a
        run takes, and a forked worker must not start a thread pool): the ids of one document at a
        time (gigatoken says so, and tests compare), at half the cost per document, read from the
        awkward Array's flat buffers without a copy per document."""
        layout = self._giga.encode_batch(texts, parallel=False).layout
        offsets = np.asarray(layout.offsets.data, dtype=np.int64)
        content = np.asarray(layout.content.data)[offsets[0]:offsets[-1]]
        return content, np.diff(offsets)

    def _raw(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """The texts' ids back to back (no specials) and their counts."""
        if self.spec.engine == "gigatoken":
            batch = self.spec.batch_chars
            if batch is not None and len(texts) > 1 and sum(map(len, texts)) >= batch:
                return self._giga_batch(texts)
            # one document at a time: gigatoken's batch call returns an awkward Array, and importing
            # awkward (~0.2 s a process) costs more than a small run's documents save
            encode = self._giga.encode
            arrays = [encode(t) for t in texts]
            raw_lengths = np.fromiter(map(len, arrays), dtype=np.int64, count=len(arrays))
            content = np.concatenate(arrays) if arrays else np.empty(0, np.uint32)
        else:
            ids = [e.ids for e in self._hf.encode_batch_fast(texts, add_special_tokens=False)]
            raw_lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
            content = np.fromiter(chain.from_iterable(ids), dtype=np.int64, count=int(raw_lengths.sum()))
        return content, raw_lengths


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
