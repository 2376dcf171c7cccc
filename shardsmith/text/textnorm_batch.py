"""``textnorm.normalize`` for a batch of documents at once: the same bytes, about 1.8x faster.

Per document, CPython's ``str.casefold`` and the whitespace collapse run at 50-130 MB/s a core on
text that is not ASCII (they walk wide strings a character at a time); over a batch, Arrow's
``utf8_lower`` and a few numpy passes over the batch's UTF-8 do the same work several times faster.

Why the result is byte-identical to ``normalize`` (NFKC, then casefold, then every whitespace
character " ", runs of " " one, trimmed), for every input:
  1. NFKC is Python's own, per document, exactly as ``normalize`` does it.
  2. ``str.casefold`` and Arrow's ``utf8_lower`` each map every code point on its own (no context).
     ``_fold_fixes`` runs both over every code point, with this Python and this Arrow, once a process:
     where they differ (373 code points with Python 3.11's Unicode 14 and pyarrow 26's utf8proc)
     the code point is replaced by its casefold before Arrow lowers the text, which is sound only
     where that casefold is left as it is by Arrow's lower and holds no code point that is replaced
     itself (checked there: 126 such, e.g. ß -> ss, ς -> σ, İ -> i̇). The others (247: Cherokee,
     which folds to upper case, and letters only Arrow's newer Unicode knows) send their document
     through ``normalize``.
  3. The four whitespace code points outside ASCII that can remain (``textnorm._SPACES``) are made
     " " in that same step: they casefold and lower to themselves, and no other code point's
     casefold holds them (checked there too); ASCII whitespace is mapped after the lower.
  4. The collapse and the trim are the same on UTF-8 as on text (" " is one byte, and no byte of a
     multi-byte character is below 0x80).
Text Arrow cannot take (lone surrogates) goes through ``normalize`` as well.
"""

from __future__ import annotations

import functools
import unicodedata
from collections.abc import Iterator, Sequence
from typing import overload

import numpy as np

from shardsmith.text import textnorm

_WIDE_SPACES = "\x85\u1680\u2028\u2029"  # the whitespace besides ASCII that NFKC and casefold leave
_TO_SPACE = bytes(32 if chr(b) in textnorm._ASCII_SPACES else b for b in range(256))
_PLANES = 0x110000
FIX, SLOW = 1, 2  # a code point replaced before Arrow's lower; one whose document takes ``normalize``


def warm() -> None:
    """Import Arrow's compute functions and build the tables now (0.1-0.4 s, most of it the first
    call into Arrow), so that processes forked later inherit them; and a first batch through each path."""
    normalize_batch(["Straße\u00a0 Ꭰ\u2028X ", "x"])


@functools.lru_cache(maxsize=1)
def _fold_fixes() -> tuple[np.ndarray, dict[int, str]] | None:
    """(per code point: 0, ``FIX`` or ``SLOW``; each ``FIX`` code point's replacement), from this
    Python's casefold and this Arrow's lower over every code point; None where the check itself
    cannot be made (then every batch takes ``normalize``)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    cps = np.concatenate([np.arange(1, 0xD800, dtype=np.uint32), np.arange(0xE000, _PLANES, dtype=np.uint32)])
    differ = []
    for chunk in np.array_split(cps, 16):  # a few MB at a time
        spaced = np.zeros(2 * len(chunk), dtype=np.uint32)  # each code point, then "\0": one string to map
        spaced[::2] = chunk
        text = spaced.tobytes().decode("utf-32-le")
        casefolded = text.casefold()
        if any(casefolded.count(c) != text.count(c) for c in _WIDE_SPACES):
            return None  # only each such space's own casefold holds it (where it is made " " first)
        utf8 = text.encode("utf-8")
        folded = np.frombuffer(casefolded.encode("utf-8"), dtype=np.uint8)
        lowered = _utf8_of(pc.utf8_lower(pa.LargeStringArray.from_buffers(
            1, pa.py_buffer(np.array([0, len(utf8)], dtype=np.int64)), pa.py_buffer(utf8))))[0]
        if np.count_nonzero(folded == 0) != len(chunk) or np.count_nonzero(lowered == 0) != len(chunk):
            return None  # "\0" is not only itself in both, so the streams cannot be cut apart
        differ.append(chunk[_elements_differ(folded, lowered)])
    fixes = {int(cp): chr(cp).casefold() for cp in np.concatenate(differ)}
    fixes.update({ord(c): " " for c in _WIDE_SPACES})
    keyed = set(map(chr, fixes))
    made = list(fixes.values())
    kept_by_lower = pc.utf8_lower(pa.array(made)).to_pylist()
    table = np.zeros(_PLANES, dtype=np.int8)
    for (cp, out), lowered_out in zip(list(fixes.items()), kept_by_lower):
        if lowered_out != out or any(c in keyed for c in out):
            table[cp] = SLOW  # e.g. Cherokee (folds to upper case), code points only Arrow's Unicode knows
            del fixes[cp]
        else:
            table[cp] = FIX
    return table, fixes


def _elements_differ(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per element of two UTF-8 streams of as many elements, each ended by a zero byte: whether they differ."""
    ends_a, ends_b = np.flatnonzero(a == 0), np.flatnonzero(b == 0)
    len_a, len_b = np.diff(ends_a, prepend=-1), np.diff(ends_b, prepend=-1)
    same_len = len_a == len_b
    both = np.flatnonzero(same_len)  # their bytes line up once the others are left out
    at = np.flatnonzero(a[np.repeat(same_len, len_a)] != b[np.repeat(same_len, len_b)])
    differ = ~same_len
    differ[both[np.searchsorted(np.cumsum(len_a[both]), at, side="right")]] = True
    return differ


class NormalBatch(Sequence[str]):
    """A batch's normalized texts, held as one UTF-8 buffer and each text's span: hashed from there
    (``doc_hashes``) and decoded to ``str`` only when something reads them as text."""

    def __init__(self, *, data: bytes, starts: np.ndarray, ends: np.ndarray) -> None:
        self.data = data
        self.starts = starts
        self.ends = ends
        self._texts: list[str] | None = None

    @classmethod
    def of_texts(cls, texts: Sequence[str]) -> NormalBatch:
        """The batch of texts that are normalized already (``surrogatepass``, as hashing encodes them)."""
        return cls.of_utf8([t.encode("utf-8", "surrogatepass") for t in texts])

    @classmethod
    def of_utf8(cls, parts: Sequence[bytes | memoryview]) -> NormalBatch:
        lengths = np.fromiter(map(len, parts), dtype=np.int64, count=len(parts))
        ends = np.cumsum(lengths)
        return cls(data=b"".join(parts), starts=ends - lengths, ends=ends)

    def utf8(self) -> Iterator[memoryview]:
        """Each text's UTF-8, without a copy."""
        view = memoryview(self.data)
        return (view[s:e] for s, e in zip(self.starts.tolist(), self.ends.tolist()))

    def texts(self) -> list[str]:
        if self._texts is None:
            self._texts = [bytes(b).decode("utf-8", "surrogatepass") for b in self.utf8()]
        return self._texts

    def __len__(self) -> int:
        return len(self.starts)

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> list[str]: ...
    def __getitem__(self, i: int | slice) -> str | list[str]:
        return self.texts()[i]

    def __iter__(self) -> Iterator[str]:
        return iter(self.texts())


def normalize_batch(texts: Sequence[str]) -> NormalBatch:
    """Each text as ``textnorm.normalize`` makes it, the batch at once (see the module docstring)."""
    fixes = _fold_fixes()
    if fixes is None or not len(texts):
        return NormalBatch.of_texts([textnorm.normalize(t) for t in texts])
    try:
        return _normalize_arrow(list(texts), *fixes)
    except UnicodeEncodeError:  # a lone surrogate: Arrow holds UTF-8 only
        return NormalBatch.of_texts([textnorm.normalize(t) for t in texts])


def _normalize_arrow(texts: list[str], table: np.ndarray, fixes: dict[int, str]) -> NormalBatch:
    import pyarrow as pa
    import pyarrow.compute as pc

    nfkc, is_nfkc = unicodedata.normalize, unicodedata.is_normalized
    pre = [t if t.isascii() or is_nfkc("NFKC", t) else nfkc("NFKC", t) for t in texts]
    arr = pa.array(pre, pa.large_string())
    data, offsets = _utf8_of(arr)
    hit_docs, hit_cps = _fixed_code_points(data, offsets, table)
    slow = np.unique(hit_docs[table[hit_cps] == SLOW]).tolist()
    for doc in slow:
        pre[doc] = ""
    if len(hit_docs):
        fixed = table[hit_cps] == FIX
        for key in np.unique(hit_docs[fixed] * _PLANES + hit_cps[fixed]).tolist():
            doc, cp = divmod(key, _PLANES)
            pre[doc] = pre[doc].replace(chr(cp), fixes[cp])
        arr = pa.array(pre, pa.large_string())
    data, offsets = _utf8_of(pc.utf8_lower(arr))
    batch = _collapsed(data.tobytes().translate(_TO_SPACE), offsets)
    if not slow:
        return batch
    parts = list(batch.utf8())
    for doc in slow:
        parts[doc] = memoryview(textnorm.normalize(texts[doc]).encode("utf-8", "surrogatepass"))
    return NormalBatch.of_utf8(parts)


def _utf8_of(arr: object) -> tuple[np.ndarray, np.ndarray]:
    """A large_string array's bytes and offsets (from 0), as numpy views."""
    validity, offsets_buf, data_buf = arr.buffers()  # type: ignore[attr-defined]
    offsets = np.frombuffer(offsets_buf, dtype=np.int64)[arr.offset: arr.offset + len(arr) + 1]  # type: ignore[attr-defined]
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    return data[offsets[0]: offsets[-1]], offsets - offsets[0]


def _fixed_code_points(data: np.ndarray, offsets: np.ndarray, table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(document, code point) of each character outside ASCII that the table says is replaced."""
    lead = np.flatnonzero(data >= 0xC0)  # the first byte of each character outside ASCII
    if not len(lead):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    padded = np.concatenate([data, np.zeros(3, np.uint8)])
    b0 = padded[lead].astype(np.int64)
    b1, b2, b3 = (padded[lead + k].astype(np.int64) & 0x3F for k in (1, 2, 3))
    cps = np.where(b0 < 0xE0, ((b0 & 0x1F) << 6) | b1,
                   np.where(b0 < 0xF0, ((b0 & 0x0F) << 12) | (b1 << 6) | b2,
                            ((b0 & 0x07) << 18) | (b1 << 12) | (b2 << 6) | b3))
    hit = table[cps] != 0
    return np.searchsorted(offsets, lead[hit], side="right") - 1, cps[hit]


def _collapsed(spaced: bytes, offsets: np.ndarray) -> NormalBatch:
    """Runs of " " made one and each text trimmed, over the batch's UTF-8 at once."""
    data = np.frombuffer(spaced, dtype=np.uint8)
    space = data == 32
    drop = np.empty_like(space)
    drop[:1] = space[:1]
    np.logical_and(space[1:], space[:-1], out=drop[1:])
    starts = offsets[:-1][offsets[:-1] < len(data)]
    drop[starts] = space[starts]  # a text's leading space goes too
    offsets = offsets - np.searchsorted(np.flatnonzero(drop), offsets)
    kept = data[~drop]
    starts, ends = offsets[:-1], offsets[1:].copy()
    filled = np.flatnonzero(ends > starts)
    ends[filled[kept[ends[filled] - 1] == 32]] -= 1  # ... and its trailing one (one at most now)
    return NormalBatch(data=kept.tobytes(), starts=starts, ends=ends)


def doc_hashes(normal: Sequence[str]) -> np.ndarray:
    """``textnorm.doc_hashes`` of normalized texts (a ``NormalBatch``: hashed from its buffer)."""
    batch = normal if isinstance(normal, NormalBatch) else NormalBatch.of_texts(normal)
    return textnorm.utf8_hashes(batch.utf8(), len(batch))
