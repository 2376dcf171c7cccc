"""Loss masks of a chat dataset (``pack-tokens --chat``): one bit per token, beside each shard.

A chat run's payload is one record per token, ``(id, mask)`` (``unit_dtype``), so the scatter,
the shuffle, the gather and the packer move a token and its bit together without knowing either;
the writers split them: the ids into the Megatron ``.bin`` as always, the bits into
``{shard}.mask.bin``, ``np.packbits`` order (the first token in the high bit of the first byte),
the last byte padded with zeros, ``ceil(tokens / 8)`` bytes. A packed shard's padding has its bit
off. Read back with ``np.unpackbits(np.fromfile(path, np.uint8), count=tokens)``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from shardsmith.core.fsutil import HashingFile
from shardsmith.errors import DatasetError

MASK_SUFFIX = ".mask.bin"


def unit_dtype(ids: np.dtype) -> np.dtype:
    """A token with its loss bit: what a chat run's workers hand the scatter."""
    return np.dtype([("id", np.dtype(ids)), ("mask", np.uint8)])


def is_masked(unit: np.dtype) -> bool:
    return np.dtype(unit).names == ("id", "mask")


def ids_dtype(unit: np.dtype) -> np.dtype:
    """The token ids' dtype of a payload unit (itself, for a run without masks)."""
    unit = np.dtype(unit)
    return unit["id"] if is_masked(unit) else unit


def pad_unit(pad_id: int, unit: np.dtype) -> Any:
    """The value a packed sequence is padded with: the pad id (with its bit off)."""
    unit = np.dtype(unit)
    return np.array((pad_id, 0), dtype=unit) if is_masked(unit) else unit.type(pad_id)


def split_units(units: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """(ids, mask as bool) of a unit array, each contiguous; (the array, None) without masks."""
    if not is_masked(units.dtype):
        return units, None
    return np.ascontiguousarray(units["id"]), units["mask"].astype(bool)


class MaskFile:
    """One shard's mask bits, written as the shard's tokens are (temporary name, hashed, renamed)."""

    def __init__(self, path: Path) -> None:
        self._file = HashingFile(path)
        self._carry = np.zeros(0, dtype=bool)  # the bits after the last whole byte
        self.tokens = 0
        self.on = 0

    def write(self, bits: np.ndarray) -> None:
        bits = np.asarray(bits, dtype=bool).reshape(-1)
        self.tokens += len(bits)
        self.on += int(np.count_nonzero(bits))
        if len(self._carry):
            bits = np.concatenate([self._carry, bits])
        whole = len(bits) - len(bits) % 8
        if whole:
            self._file.write(np.packbits(bits[:whole]).tobytes())
        self._carry = bits[whole:].copy()

    def commit(self) -> dict[str, Any]:
        """The sidecar's manifest entry (with the tokens it covers and how many the loss counts)."""
        if len(self._carry):
            self._file.write(np.packbits(self._carry).tobytes())
        sha = self._file.commit()
        return {"path": self._file.path.name, "bytes": self._file.bytes, "sha256": sha, "tokens": self.tokens,
                "trained": self.on}

    def abort(self) -> None:
        self._file.abort()


def mask_bytes(tokens: int) -> int:
    return -(-int(tokens) // 8)


def bits_of(data: Any, tokens: int) -> np.ndarray | None:
    """A whole sidecar's bits for ``tokens`` tokens, as bool (None when its size is not theirs)."""
    packed = np.frombuffer(data, dtype=np.uint8)
    if len(packed) != mask_bytes(tokens):
        return None
    return np.unpackbits(packed, count=tokens).astype(bool)


class ShardMasks:
    """The loss bits of one split's shards, each sidecar read whole on first use through the
    dataset's files (its size checked; fetched and hashed like any sidecar for a URL) and kept
    packed, an eighth of a byte per token, until ``release``."""

    def __init__(self, files: Any, entries: list[dict[str, Any]], starts: np.ndarray, *, where: Any) -> None:
        self._files, self._entries, self._starts, self._where = files, entries, starts, where
        self._packed: dict[int, np.ndarray] = {}
        for e, tokens in zip(entries, np.diff(starts).tolist()):
            side = e.get("mask")
            if not isinstance(side, dict):
                raise DatasetError(f"{where}: shard {e.get('path')!r} names no loss mask (made without --chat?)")
            if int(side.get("bytes", -1)) != mask_bytes(tokens):
                raise DatasetError(f"{files.name_of(side['path'])}: {side.get('bytes')} bytes of mask for "
                                   f"{tokens} tokens (want {mask_bytes(tokens)})")

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_packed": {}}

    def release(self) -> None:
        self._packed = {}

    def _shard(self, s: int) -> np.ndarray:
        got = self._packed.get(s)
        if got is None:
            got = self._packed[s] = np.frombuffer(self._files.sidecar(self._entries[s]["mask"]), dtype=np.uint8)
        return got

    def span(self, start: int, width: int) -> np.ndarray:
        """The bits of tokens ``[start, start + width)`` of the split's stream, as bool."""
        out = np.zeros(width, dtype=bool)
        pos, end = start, start + width
        while pos < end:
            s = int(np.searchsorted(self._starts, pos, side="right") - 1)
            stop = min(end, int(self._starts[s + 1]))
            a, b = pos - int(self._starts[s]), stop - int(self._starts[s])
            packed = self._shard(s)[a // 8:-(-b // 8)]
            bits = np.unpackbits(packed).astype(bool)
            out[pos - start:stop - start] = bits[a % 8:a % 8 + (b - a)]
            pos = stop
        return out


def verify_masks(files: Any, shards: list[dict[str, Any]], dtype: np.dtype) -> list[str]:
    """``verify``: each shard's mask covers its tokens (its bytes and hash are checked with the other
    files), the pad bits after the last token are zero, and the manifest's count of trained tokens holds."""
    problems = []
    for shard in shards:
        side = shard.get("mask")
        if not isinstance(side, dict):
            problems.append(f"{shard['path']}: the manifest names no loss mask for it")
            continue
        tokens = int(shard["bytes"]) // np.dtype(dtype).itemsize
        try:
            data = files.sidecar(side)
        except (DatasetError, OSError) as exc:
            problems.append(str(exc))
            continue
        bits = bits_of(data, tokens)
        if bits is None or int(side.get("tokens", -1)) != tokens:
            problems.append(f"{side['path']}: {len(data)} bytes for {side.get('tokens')} tokens, the shard holds "
                            f"{tokens} (want {mask_bytes(tokens)} bytes)")
            continue
        if np.unpackbits(np.frombuffer(data, dtype=np.uint8)[-1:])[tokens % 8 or 8:].any():
            problems.append(f"{side['path']}: bits set after the shard's last token")
        if int(side.get("trained", -1)) != int(np.count_nonzero(bits)):
            problems.append(f"{side['path']}: {int(np.count_nonzero(bits))} tokens trained on, the "
                            f"manifest says {side.get('trained')}")
    return problems
