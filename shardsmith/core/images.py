"""Image validation without decoding: magic number, dimensions and end marker, read from the headers.

Zero-copy conversion writes image bytes into shards unchanged, so a truncated or non-image file
must be caught here, cheaply. The default "header" level parses each format's header in pure
Python (microseconds, Pillow is never imported); "full" decodes the whole image. EXIF orientation
is ignored, as torchvision's loader ignores it.

One pixel limit (``--max-image-pixels``, recorded in the manifest) is what ``convert`` (both levels),
``verify --deep`` and the loader's decoders accept, checked here from the header dimensions; Pillow's
own decompression-bomb check (a module global, with a warning band below its error) is lifted only
while shardsmith decodes an image whose size it has checked.
"""

from __future__ import annotations

import contextlib
import io
import os
import struct
import threading
import warnings
from collections.abc import Iterator
from typing import Any, NamedTuple

from shardsmith.errors import UsageError, install_hint

EXTENSIONS = {"jpg": "jpeg", "jpeg": "jpeg", "png": "png", "webp": "webp", "bmp": "bmp"}
LEVELS = ("none", "header", "full")
# Pillow's own default ``Image.MAX_IMAGE_PIXELS`` (int(1024 * 1024 * 1024 // 4 // 3)): the default
# limit, spelled out so that parsing options never imports Pillow
MAX_IMAGE_PIXELS = 89_478_485
_CANONICAL_EXT = {"jpeg": "jpg", "png": "png", "webp": "webp", "bmp": "bmp", "gif": "gif"}

_PNG_SIG = b"\x89PNG\r\n\x1a\n"
_PNG_IEND = b"\x00\x00\x00\x00IEND\xaeB`\x82"
# SOFn markers carry the frame size; C4 (DHT), C8 (JPG) and CC (DAC) share the range but do not
_JPEG_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})
_JPEG_STANDALONE = frozenset({0x01, *range(0xD0, 0xD8)})


class ImageError(Exception):
    """Bad image data, with a one-line reason; the caller adds the file name."""


class ImageInfo(NamedTuple):  # a tuple: made once per image, in the zero-copy path's inner loop
    format: str  # "jpeg" | "png" | "webp" | "bmp" | "gif"
    width: int
    height: int


def canonical_ext(format: str) -> str:
    """The member extension used in tar shards for an image format ("jpeg" -> "jpg")."""
    try:
        return _CANONICAL_EXT[format]
    except KeyError:
        raise ValueError(f"unknown image format {format!r}") from None


def sniff(data: bytes | memoryview) -> str | None:
    """The format named by the magic number, or None."""
    head = bytes(data[:12])
    if head[:3] == b"\xff\xd8\xff":
        return "jpeg"
    if head[:8] == _PNG_SIG:
        return "png"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "webp"
    if head[:2] == b"BM":
        return "bmp"
    if head[:6] in (b"GIF87a", b"GIF89a"):
        return "gif"
    return None


def check_image(data: bytes | memoryview, *, level: str = "header",
                max_pixels: int = MAX_IMAGE_PIXELS) -> ImageInfo | None:
    """Check that ``data`` is a whole image of a known format; raise ImageError with the reason.

    "none" skips the check (None, and no pixel limit: nothing is read); "header" reads the size
    from the headers, refuses more than ``max_pixels`` pixels and checks the end marker (JPEG EOI,
    PNG IEND, WebP RIFF size, BMP pixel array); "full" also decodes every pixel (a JPEG strictly:
    libjpeg's corrupt-data warnings are errors).
    """
    if level == "none":
        return None
    if level not in LEVELS:
        raise ValueError(f"unknown image check level {level!r}; expected one of {', '.join(LEVELS)}")
    if len(data) == 0:
        raise ImageError("empty file")
    if data[:3] == b"\xff\xd8\xff":  # JPEG, by far the most common: no copy of the head to sniff it
        width, height = _jpeg(data)
        if width <= 0 or height <= 0:
            raise ImageError(f"bad JPEG dimensions {width}x{height}")
        if width * height > max_pixels:
            raise ImageError(_too_many(width, height, max_pixels))
        info = ImageInfo("jpeg", width, height)
        if level == "full":
            _decode_fully(data, info, max_pixels)
        return info
    fmt = sniff(data)
    if fmt is None:
        raise ImageError(f"not an image (unknown magic bytes {bytes(data[:4]).hex()})")
    width, height = _PARSERS[fmt](data)
    if width <= 0 or height <= 0:
        raise ImageError(f"bad {fmt.upper()} dimensions {width}x{height}")
    if width * height > max_pixels:
        raise ImageError(_too_many(width, height, max_pixels))
    info = ImageInfo(fmt, width, height)
    if level == "full":
        _decode_fully(data, info, max_pixels)
    return info


def _too_many(width: int, height: int, max_pixels: int) -> str:
    return (f"{width}x{height} is {width * height:,} pixels, more than the limit of {max_pixels:,} "
            f"(--max-image-pixels)")


def pixel_limit(manifest: dict[str, Any]) -> int:
    """A dataset's pixel limit: the manifest's ``max_image_pixels`` (datasets written before it:
    the default). A value that is not a whole number >= 1 is a DatasetError."""
    from shardsmith.errors import DatasetError

    value = manifest.get("max_image_pixels", MAX_IMAGE_PIXELS)
    if type(value) is not int or value < 1:
        raise DatasetError(f"manifest.json: max_image_pixels must be a whole number >= 1, got {value!r}")
    return value


class _PillowLimit:
    """Pillow's global bomb limit, lifted while any of our decodes runs (threads share the module)."""

    lock = threading.Lock()
    users = 0
    saved: int | None = None


def _after_fork() -> None:  # a fork during another thread's decode: no decode runs in the child
    if _PillowLimit.users:
        import PIL.Image

        PIL.Image.MAX_IMAGE_PIXELS = _PillowLimit.saved
    _PillowLimit.lock = threading.Lock()
    _PillowLimit.users = 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


@contextlib.contextmanager
def _pillow_limit_lifted(Image: Any) -> Iterator[None]:
    with _PillowLimit.lock:
        if _PillowLimit.users == 0:
            _PillowLimit.saved = Image.MAX_IMAGE_PIXELS
            Image.MAX_IMAGE_PIXELS = None
        _PillowLimit.users += 1
    try:
        yield
    finally:
        with _PillowLimit.lock:
            _PillowLimit.users -= 1
            if _PillowLimit.users == 0:
                Image.MAX_IMAGE_PIXELS = _PillowLimit.saved


@contextlib.contextmanager
def pillow_open(data: bytes | memoryview, *, max_pixels: int, quiet: bool = False) -> Iterator[Any]:
    """The image opened by Pillow (headers only) with its size checked against ``max_pixels``
    (ImageError); decode it inside the block, where Pillow's own global limit is lifted (our limit
    may be above its default) and is restored after. ``quiet`` drops Pillow's warnings (metadata:
    EXIF, MPO; palettes), which say nothing about the pixels written: a command run with --quiet
    prints nothing but errors. Not thread-safe with ``quiet`` (the warnings filters are global)."""
    from PIL import Image

    with contextlib.ExitStack() as stack:
        if quiet:
            stack.enter_context(warnings.catch_warnings())
            warnings.simplefilter("ignore")
        stack.enter_context(_pillow_limit_lifted(Image))
        im = Image.open(io.BytesIO(data))
        width, height = im.size
        if width * height > max_pixels:
            im.close()
            raise ImageError(_too_many(width, height, max_pixels))
        yield im


def _u16be(data: bytes | memoryview, i: int) -> int:
    return (data[i] << 8) | data[i + 1]


_SEGMENT = struct.Struct(">BBH")  # 0xFF, marker, segment length
_FRAME = struct.Struct(">HH")  # height, width (3 bytes into a frame header's segment)


def _jpeg(data: bytes | memoryview) -> tuple[int, int]:
    """(width, height) from the frame header; the image must end with EOI (after any padding)."""
    n = len(data)
    i = 2
    # fast path: back-to-back segments without fill bytes, as encoders write them; anything
    # else (fill bytes, standalone markers, a cut or corrupt header) goes to the careful walk
    # below from where this one stopped, which raises the exact fault
    unpack = _SEGMENT.unpack_from
    while i + 4 <= n:
        ff, marker, length = unpack(data, i)
        if ff != 0xFF or marker == 0xFF or marker in _JPEG_STANDALONE or marker in (0xD9, 0xDA) or length < 2:
            break
        if marker in _JPEG_SOF:
            if length < 7 or i + 9 > n:
                break
            height, width = _FRAME.unpack_from(data, i + 5)
            _jpeg_eoi(data, i + 2 + length)
            return width, height
        i += 2 + length
    return _jpeg_careful(data, i)


def _jpeg_eoi(data: bytes | memoryview, i: int) -> None:
    # real files may end in padding (zeros, whitespace) or a vendor trailer after EOI; a truncated
    # scan has no EOI after the frame header at all, and EOI cannot occur inside entropy-coded data
    if not (data[-2] == 0xFF and data[-1] == 0xD9) and bytes(data).rfind(b"\xff\xd9", i) < 0:
        raise ImageError("truncated JPEG: no EOI marker")


def _jpeg_careful(data: bytes | memoryview, i: int) -> tuple[int, int]:
    """The marker walk from byte ``i`` (at a marker or its fill bytes), naming any fault."""
    n = len(data)
    size: tuple[int, int] | None = None
    while size is None:
        while i < n and data[i] == 0xFF:  # markers may be preceded by any number of fill bytes
            i += 1
        if i >= n:
            raise ImageError("truncated JPEG: header ends before the frame size")
        if data[i - 1] != 0xFF:
            raise ImageError(f"corrupt JPEG header: expected a marker at byte {i - 1}")
        marker = data[i]
        i += 1
        if marker in _JPEG_STANDALONE:
            continue
        if marker in (0xD9, 0xDA):
            raise ImageError("cannot read dimensions: JPEG has no frame header before its image data")
        if i + 2 > n:
            raise ImageError("truncated JPEG: header ends before the frame size")
        length = _u16be(data, i)
        if length < 2:
            raise ImageError(f"corrupt JPEG header: segment length {length} at byte {i}")
        if marker in _JPEG_SOF:
            if length < 7 or i + 7 > n:
                raise ImageError("cannot read dimensions: JPEG frame header is cut short")
            size = (_u16be(data, i + 5), _u16be(data, i + 3))
        i += length
    _jpeg_eoi(data, i)
    return size


def _png(data: bytes | memoryview) -> tuple[int, int]:
    if len(data) < 24 or bytes(data[12:16]) != b"IHDR":
        raise ImageError("cannot read dimensions: PNG has no IHDR chunk")
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    if bytes(data[-12:]) != _PNG_IEND and not _png_has_iend(data):
        raise ImageError("PNG without IEND (truncated)")
    return width, height


def _png_has_iend(data: bytes | memoryview) -> bool:
    """Walk the chunks: IEND may be followed by trailing bytes, which readers ignore."""
    i, n = 8, len(data)
    while i + 8 <= n:
        length = int.from_bytes(data[i:i + 4], "big")
        if bytes(data[i + 4:i + 8]) == b"IEND":
            return True
        i += 12 + length
    return False


def _webp(data: bytes | memoryview) -> tuple[int, int]:
    if len(data) < 30:
        raise ImageError("cannot read dimensions: WebP is cut short")
    riff_size = int.from_bytes(data[4:8], "little")
    chunk = bytes(data[12:16])
    if chunk == b"VP8 ":
        if bytes(data[23:26]) != b"\x9d\x01\x2a":
            raise ImageError("cannot read dimensions: bad VP8 frame start code")
        size = (int.from_bytes(data[26:28], "little") & 0x3FFF, int.from_bytes(data[28:30], "little") & 0x3FFF)
    elif chunk == b"VP8L":
        if data[20] != 0x2F:
            raise ImageError("cannot read dimensions: bad VP8L signature")
        bits = int.from_bytes(data[21:25], "little")
        size = ((bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1)
    elif chunk == b"VP8X":
        size = (int.from_bytes(data[24:27], "little") + 1, int.from_bytes(data[27:30], "little") + 1)
    else:
        raise ImageError(f"cannot read dimensions: unknown WebP chunk {chunk!r}")
    if riff_size + 8 > len(data):
        raise ImageError(f"truncated WebP: {len(data)} bytes of {riff_size + 8}")
    return size


def _bmp(data: bytes | memoryview) -> tuple[int, int]:
    if len(data) < 26:
        raise ImageError("cannot read dimensions: BMP header is cut short")
    header = int.from_bytes(data[14:18], "little")
    if header == 12:  # OS/2 BITMAPCOREHEADER
        return int.from_bytes(data[18:20], "little"), int.from_bytes(data[20:22], "little")
    if header < 40 or len(data) < 34:
        raise ImageError(f"cannot read dimensions: unknown BMP header size {header}")
    width = int.from_bytes(data[18:22], "little", signed=True)
    height = abs(int.from_bytes(data[22:26], "little", signed=True))  # negative: rows top-down
    bits, compression = int.from_bytes(data[28:30], "little"), int.from_bytes(data[30:34], "little")
    if compression in (0, 3) and width > 0:  # uncompressed: the pixel array size is known
        end = int.from_bytes(data[10:14], "little") + ((bits * width + 31) // 32) * 4 * height
        if end > len(data):
            raise ImageError(f"truncated BMP: {len(data)} bytes of {end}")
    return width, height


def _gif(data: bytes | memoryview) -> tuple[int, int]:
    if len(data) < 10:
        raise ImageError("cannot read dimensions: GIF header is cut short")
    return int.from_bytes(data[6:8], "little"), int.from_bytes(data[8:10], "little")


_PARSERS = {"jpeg": _jpeg, "png": _png, "webp": _webp, "bmp": _bmp, "gif": _gif}


def _decode_fully(data: bytes | memoryview, info: ImageInfo, max_pixels: int) -> None:
    """Decode every pixel. JPEG goes through simplejpeg in strict mode when installed, since
    Pillow silently fills corrupt entropy-coded data with gray."""
    if info.format == "jpeg" and strict_jpeg_check(data):
        return
    require_pillow("decoding every image (verify --deep, convert --check-images full)")
    try:
        with pillow_open(data, max_pixels=max_pixels, quiet=True) as im:
            im.load()
    except ImageError:
        raise
    except Exception as e:  # Pillow raises OSError, SyntaxError, ValueError, struct.error, ...
        raise ImageError(f"cannot decode {info.format.upper()}: {e}") from None


def require_pillow(needed_by: str) -> None:
    """Pillow imports, or one line naming the images extra: a run that would decode images refuses
    before any work rather than fail with ImportError in a worker (``needed_by``: what asked)."""
    try:
        import PIL.Image  # noqa: F401
    except ImportError:
        raise UsageError(f"{needed_by} needs Pillow, which is not installed: {install_hint('images')}") from None


def strict_jpeg_check(data: bytes | memoryview, *, scaled: bool = False) -> bool:
    """Decode a JPEG with simplejpeg in strict mode, where libjpeg's warnings ("Corrupt JPEG data:
    ...", which Pillow never reports) are errors: ImageError. False when simplejpeg is not installed
    (nothing was checked). ``scaled`` decodes at 1/8 scale: every bit of the entropy-coded data is
    still read (the same warnings), without the full-size inverse DCT and colour conversion."""
    try:
        import simplejpeg
    except ImportError:
        return False
    try:
        height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
        target = "CMYK" if colorspace in ("CMYK", "YCCK") else "GRAY" if colorspace == "Gray" else "RGB"
        if scaled:
            simplejpeg.decode_jpeg(data, colorspace=target, strict=True, min_factor=8.0,
                                   min_width=1, min_height=1)
        else:
            simplejpeg.decode_jpeg(data, colorspace=target, strict=True)  # any libjpeg warning is an error
    except ValueError as e:
        raise ImageError(f"cannot decode JPEG: {e}") from None
    return True
