"""Member bytes into values for the tar loader: the kinds that are safe to decode (int, json, text,
npy without pickles, images when asked), chosen by the manifest's schema or the extension; every
other member, pickle-like ones (``.pyd``, ``.pth``, …) included, stays bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import orjson

from shardsmith.core.images import MAX_IMAGE_PIXELS, pillow_open  # stdlib only: no Pillow
from shardsmith.core.npy import read_npy
from shardsmith.errors import DatasetError

KINDS = ("image", "int", "json", "text", "bytes", "npy")
DECODES = (None, "pil", "numpy")
# Kinds by the last component of an extension, as webdataset names them; anything else is bytes.
_EXT_KINDS = {
    **dict.fromkeys(("cls", "cls2", "class", "count", "index", "inx", "id"), "int"),
    **dict.fromkeys(("json", "jsn"), "json"),
    **dict.fromkeys(("txt", "text", "transcript"), "text"),
    "npy": "npy",
    **dict.fromkeys(("jpg", "jpeg", "png", "ppm", "pgm", "pbm", "pnm", "bmp", "webp", "gif", "tif", "tiff"),
                    "image"),
}
def load_npy(data: bytes, *, where: str) -> np.ndarray:
    """A .npy payload without pickles, its header checked against its size before anything is allocated
    (``core/npy.py``); a writable copy, as ``np.load`` gives."""
    return read_npy(data, where=where).copy()


def _text(data: bytes) -> str:
    return data.decode("utf-8")


def _image_decoder(mode: str, max_pixels: int) -> Callable[[bytes], Any]:
    """Pillow decoding up to the dataset's pixel limit (``convert --max-image-pixels``), above or
    below Pillow's own global default, which is left as it was."""

    def decode(data: bytes) -> Any:
        with pillow_open(data, max_pixels=max_pixels) as img:  # an image over the limit: ImageError
            img.load()  # decode now, so a corrupt image fails here and not in the user's transform
            # np.array, not asarray: Pillow's buffer is read-only, and torch warns on (and must not write to)
            # a non-writable array; the copy costs ~1 % of the decode
            return img if mode == "pil" else np.array(img.convert("RGB"))

    return decode


def _decoder(kind: str, decode: str | None, max_pixels: int = MAX_IMAGE_PIXELS) -> Callable[[bytes], Any] | None:
    """The function that turns a member's bytes into a value, or None to keep the bytes."""
    if kind == "int":
        return int  # int(b" 7\n") == 7; junk raises ValueError (the reader's guard names the member)
    if kind == "json":
        return orjson.loads
    if kind == "text":
        return _text
    if kind == "image" and decode is not None:
        return _image_decoder(decode, max_pixels)
    return None


def _guard(decoder: Callable[[bytes], Any], ext: str, where: str) -> Callable[[bytes, int], Any]:
    """``decoder``, raising DatasetError that names the shard and byte when stored bytes do not decode."""
    if decoder is load_npy:
        return lambda raw, start: load_npy(raw, where=f"{where}: member .{ext} at byte {start}")

    def decode(raw: bytes, start: int) -> Any:
        try:
            return decoder(raw)
        except Exception as exc:  # any decoder failure on stored bytes is a corrupt dataset, not a bug
            raise DatasetError(f"{where}: member .{ext} at byte {start} does not decode "
                               f"({type(exc).__name__}: {exc})") from None

    return decode


def _safe_field_handler(key: str, data: bytes) -> Any:
    """A webdataset decoding handler for int/json/text/npy members; None leaves the rest as bytes."""
    ext = key.rsplit(".", 1)[-1].lower()
    kind = _EXT_KINDS.get(ext)
    if kind == "npy":
        return load_npy(data, where=key)
    decoder = _decoder(kind, None) if kind else None
    return None if decoder is None else decoder(data)


def _schema_kinds(schema: Any) -> dict[str, str]:
    """ext → kind from the manifest's schema; entries that are not one of KINDS are ignored."""
    kinds: dict[str, str] = {}
    if isinstance(schema, dict):
        for ext, spec in schema.items():
            kind = spec.get("kind") if isinstance(spec, dict) else spec
            if isinstance(ext, str) and kind in KINDS:
                kinds[ext] = kind
    return kinds

