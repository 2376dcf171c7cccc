"""Deterministic offline augmentation: K variants per image, each a pure function of (seed, identity, copy).

The ops are planned on the source image's coordinates before any pixel is touched: the chain
collapses into one source box, one output size and a flip. That allows one resample per image
(no intermediate images) and decoding a JPEG at reduced scale whenever the box is much larger
than the output, without changing which pixels a crop selects. Randomness comes from blake2b in
counter mode, keyed by (seed, copy, identity): no global state, no dependence on numpy's stream
policy, so bytes are the same for any number of workers and any call order.

This module parses ``--augment`` and applies a chain to encoded images (decode, one resample,
encode); the ops and their planning live in ``augment_ops``.
"""

from __future__ import annotations

import io
import math
from typing import Any

import numpy as np

from shardsmith.core.images import (
    MAX_IMAGE_PIXELS,
    ImageError,
    ImageInfo,
    check_image,
    pillow_open,
    strict_jpeg_check,
)
from shardsmith.errors import UsageError, install_hint
from shardsmith.kit.transform import Transform
from shardsmith.transforms.augment_ops import (
    CenterCrop,
    HFlip,
    Op,
    RandomCrop,
    RandomResizedCrop,
    Resize,
    View,
    _Draws,
    _snap,
    draw_key,
)

__all__ = ["ENGINES", "Augmenter", "CenterCrop", "HFlip", "Op", "RandomCrop", "RandomResizedCrop", "Resize",
           "View", "draw_key", "parse_augment"]

ENGINES = ("auto", "simplejpeg", "pillow")
_MAX_SIDE = 65500  # JPEG's limit
_SYNTAX = "resize=N, center-crop=N|WxH, random-crop=N|WxH, random-resized-crop=N|WxH, hflip[=P]"


# --------------------------------------------------------------------------- parsing


def parse_augment(spec: str) -> list[Op]:
    """Parse ``"random-resized-crop=224,hflip"`` into ops; a bad spec is a UsageError naming the op."""
    ops: list[Op] = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            raise UsageError(f"empty op in --augment {spec!r}; valid ops: {_SYNTAX}")
        name, _, value = part.partition("=")
        name, value = name.strip().lower(), value.strip()
        if name == "hflip":
            ops.append(HFlip(_probability(part, value) if value else 0.5))
        elif name == "resize":
            ops.append(Resize(_side(part, value)))
        elif name in ("center-crop", "random-crop", "random-resized-crop"):
            cls = {"center-crop": CenterCrop, "random-crop": RandomCrop, "random-resized-crop": RandomResizedCrop}
            ops.append(cls[name](*_size(part, value)))
        else:
            raise UsageError(f"unknown augmentation {part!r} in --augment; valid ops: {_SYNTAX}")
    return ops


def _side(part: str, value: str) -> int:
    if not value.isdigit() or not 0 < int(value) <= _MAX_SIDE:
        raise UsageError(f"bad size in --augment op {part!r}: expected a whole number of pixels 1..{_MAX_SIDE}; "
                         f"valid ops: {_SYNTAX}")
    return int(value)


def _size(part: str, value: str) -> tuple[int, int]:
    w, x, h = value.lower().partition("x")
    return (_side(part, w), _side(part, h)) if x else (_side(part, value),) * 2


def _probability(part: str, value: str) -> float:
    try:
        p = float(value)
    except ValueError:
        p = -1.0
    if not 0.0 <= p <= 1.0:
        raise UsageError(f"bad probability in --augment op {part!r}: expected a number in [0, 1]; valid ops: {_SYNTAX}")
    return p


# --------------------------------------------------------------------------- pixels


def _have_simplejpeg() -> bool:
    try:
        import simplejpeg  # noqa: F401
    except ImportError:
        return False
    return True


class Augmenter(Transform):
    """The ``augment`` transform: applies a parsed op chain to encoded images and re-encodes them as JPEG.

    ``engine`` picks the JPEG codec: "auto" takes simplejpeg when installed, else Pillow. The
    outputs differ between codecs (and their versions), so the manifest records ``engine``.
    A source JPEG is decoded strictly: libjpeg's corrupt-data warnings (a garbled scan, which Pillow
    decodes without a word) are ImageError. With the Pillow engine, JPEGs are first checked by
    simplejpeg at 1/8 scale when it is installed; Pillow alone cannot see a garbled scan.
    Images over ``max_image_pixels`` are ImageError before anything is decoded.
    """

    name = "augment"
    applies_to = ("images",)

    @classmethod
    def from_spec(cls, spec: str | None, *, opts: Any) -> Augmenter:
        """From ``--augment SPEC`` and the command's ``--quality``, ``--seed`` and ``--max-image-pixels``."""
        return cls(ops=parse_augment(spec or ""), quality=opts.quality, seed=opts.seed,
                   max_image_pixels=opts.max_image_pixels)

    def __init__(self, *, ops: list[Op], quality: int = 90, seed: int = 0, engine: str = "auto",
                 max_image_pixels: int = MAX_IMAGE_PIXELS) -> None:
        if not ops:
            raise UsageError(f"--augment needs at least one op; valid ops: {_SYNTAX}")
        if not 1 <= quality <= 100:
            raise UsageError(f"--quality must be within 1..100, got {quality}")
        if engine not in ENGINES:
            raise UsageError(f"unknown image engine {engine!r}; expected one of {', '.join(ENGINES)}")
        if engine == "auto":
            engine = "simplejpeg" if _have_simplejpeg() else "pillow"
        elif engine == "simplejpeg" and not _have_simplejpeg():
            raise UsageError(f"image engine simplejpeg is not installed: {install_hint('images')}")
        self.ops = list(ops)
        self.quality = quality
        self.seed = seed
        self.engine = engine
        self.max_image_pixels = max_image_pixels
        self.random = any(op.random for op in self.ops)

    @property
    def spec(self) -> str:
        """The canonical --augment string of the ops."""
        return ",".join(str(op) for op in self.ops)

    def describe(self) -> dict:
        """What the manifest should record to make the bytes reproducible."""
        import PIL

        versions = {"pillow": PIL.__version__}
        if self.engine == "simplejpeg":
            import simplejpeg

            versions["simplejpeg"] = simplejpeg.__version__
        return {"augment": self.spec, "quality": self.quality, "seed": self.seed, "random": self.random,
                "engine": self.engine, "versions": versions}

    def plan(self, width: int, height: int, *, identity: str, copy: int) -> View:
        """Where variant ``copy`` of an image of this size comes from, in source pixels."""
        draws = _Draws(draw_key(self.seed, identity, copy)) if self.random else None
        view = View((0.0, 0.0, float(width), float(height)), (width, height))
        for op in self.ops:
            view = op.plan(view, draws)
        return view

    def apply(self, data: bytes | memoryview, *, identity: str, copy: int) -> bytes:
        """Variant ``copy`` of one encoded image, as JPEG bytes. Bad image data raises ImageError."""
        info = check_image(data, level="header", max_pixels=self.max_image_pixels)
        view = self.plan(info.width, info.height, identity=identity, copy=copy)
        x0, y0, x1, y1 = view.box
        # the decode scale that still leaves the box at least as large as the output
        need = max(view.size[0] / (x1 - x0), view.size[1] / (y1 - y0))
        im, scale = self._decode(data, info, need if need <= 0.5 else 1.0)
        if scale != (1.0, 1.0):
            view = View((x0 * scale[0], y0 * scale[1], x1 * scale[0], y1 * scale[1]), view.size, view.flip)
        im = _render(im, view)
        return self._encode(im)

    def _decode(self, data: bytes | memoryview, info: ImageInfo, need: float):
        """The decoded RGB image and its scale (x, y) relative to the source; ``need`` < 1 allows
        a JPEG to be decoded at a reduced scale no smaller than ``need``."""
        from PIL import Image

        fmt = info.format
        if fmt == "jpeg" and self.engine == "simplejpeg":
            import simplejpeg

            try:
                if need < 1.0:  # factor >= 2: simplejpeg warns that finer scales can decode slower than 1/1
                    arr = simplejpeg.decode_jpeg(data, colorspace="RGB", strict=True, min_factor=2.0,
                                                 min_width=math.ceil(info.width * need),
                                                 min_height=math.ceil(info.height * need))
                else:
                    arr = simplejpeg.decode_jpeg(data, colorspace="RGB", strict=True)
            except ValueError as e:
                # CMYK, which libjpeg-turbo will not convert to RGB, goes to Pillow (checked strictly
                # there); anything else is bad data, a corrupt-data warning included
                if _colorspace(simplejpeg, data) not in ("CMYK", "YCCK"):
                    raise ImageError(f"cannot decode JPEG: {e}") from None
            else:
                h, w = arr.shape[:2]
                return Image.fromarray(arr), _jpeg_scale(info, w, h)
        if fmt == "jpeg":
            strict_jpeg_check(data, scaled=True)
        try:
            with pillow_open(data, max_pixels=self.max_image_pixels, quiet=True) as im:
                scale = (1.0, 1.0)
                if fmt == "jpeg" and need < 1.0:
                    src_w, src_h = im.size
                    drafted = im.draft("RGB", (math.ceil(src_w * need), math.ceil(src_h * need)))
                    if drafted is not None:
                        box = drafted[1]
                        scale = ((box[2] - box[0]) / src_w, (box[3] - box[1]) / src_h)
                im.load()
                if im.mode != "RGB":
                    im = im.convert("RGB")
                return im, scale
        except ImageError:
            raise
        except Exception as e:  # Pillow raises OSError, SyntaxError, ValueError, struct.error, ...
            raise ImageError(f"cannot decode {fmt.upper()}: {e}") from None

    def _encode(self, im) -> bytes:
        """JPEG with 4:2:0 chroma, as both codecs' usual default: a third smaller than 4:4:4 and faster."""
        if self.engine == "simplejpeg":
            import simplejpeg

            return simplejpeg.encode_jpeg(np.asarray(im), quality=self.quality, colorspace="RGB",
                                          colorsubsampling="420")
        buf = io.BytesIO()
        im.save(buf, format="JPEG", quality=self.quality, subsampling="4:2:0")
        return buf.getvalue()


def _colorspace(simplejpeg: Any, data: bytes | memoryview) -> str | None:
    try:
        return simplejpeg.decode_jpeg_header(data)[2]
    except ValueError:
        return None


def _jpeg_scale(info: ImageInfo, width: int, height: int) -> tuple[float, float]:
    """libjpeg scales by n/8 and rounds sizes up: find n from the decoded size."""
    if (width, height) == (info.width, info.height):
        return (1.0, 1.0)
    for n in range(7, 0, -1):
        if (math.ceil(info.width * n / 8), math.ceil(info.height * n / 8)) == (width, height):
            return (n / 8, n / 8)
    return (width / info.width, height / info.height)


def _render(im, view: View):
    """Cut ``view.box`` out of ``im`` at ``view.size`` in one resample, padding outside with black."""
    from PIL import Image

    x0, y0, x1, y1 = box = tuple(_snap(v) for v in view.box)
    out_w, out_h = view.size
    width, height = im.size
    if x0 >= 0 and y0 >= 0 and x1 <= width and y1 <= height:
        im = _resample(im, box, view.size)
    else:
        canvas = Image.new("RGB", view.size)
        sx, sy = out_w / (x1 - x0), out_h / (y1 - y0)
        inner = (max(x0, 0.0), max(y0, 0.0), min(x1, float(width)), min(y1, float(height)))
        ox0, oy0 = round((inner[0] - x0) * sx), round((inner[1] - y0) * sy)
        ox1, oy1 = round((inner[2] - x0) * sx), round((inner[3] - y0) * sy)
        if ox1 > ox0 and oy1 > oy0:
            canvas.paste(_resample(im, inner, (ox1 - ox0, oy1 - oy0)), (ox0, oy0))
        im = canvas
    if view.flip:
        im = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return im


def _resample(im, box: tuple[float, float, float, float], size: tuple[int, int]):
    from PIL import Image

    x0, y0, x1, y1 = box
    if (x1 - x0, y1 - y0) == size and all(float(v).is_integer() for v in box):
        if box == (0, 0, *im.size):
            return im
        return im.crop(tuple(int(v) for v in box))
    return im.resize(size, Image.Resampling.BILINEAR, box=box)
