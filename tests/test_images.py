"""Image checks: sizes from every format's header, and a clear reason for each kind of bad file."""

from __future__ import annotations

import io
import pickle
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from shardsmith.core.images import EXTENSIONS, ImageError, ImageInfo, canonical_ext, check_image

W, H = 67, 45  # odd and non-square: catches swapped or off-by-one fields


def encode(fmt: str, *, mode: str = "RGB", size: tuple[int, int] = (W, H), **kw) -> bytes:
    rng = np.random.default_rng(0)
    arr = rng.integers(0, 256, (size[1], size[0], 4), dtype=np.uint8)
    im = Image.fromarray(arr, "RGBA").convert(mode)
    buf = io.BytesIO()
    im.save(buf, fmt, **kw)
    return buf.getvalue()


@pytest.fixture(scope="module")
def jpeg() -> bytes:
    return encode("JPEG", quality=90)


@pytest.fixture(scope="module")
def png() -> bytes:
    return encode("PNG")


SAMPLES = {
    "jpeg": ("jpeg", lambda: encode("JPEG")),
    "jpeg-progressive": ("jpeg", lambda: encode("JPEG", progressive=True)),
    "jpeg-gray": ("jpeg", lambda: encode("JPEG", mode="L")),
    "jpeg-cmyk": ("jpeg", lambda: encode("JPEG", mode="CMYK")),
    "png": ("png", lambda: encode("PNG")),
    "png-rgba": ("png", lambda: encode("PNG", mode="RGBA")),
    "png-palette": ("png", lambda: encode("PNG", mode="P")),
    "webp-lossy": ("webp", lambda: encode("WEBP")),
    "webp-lossless": ("webp", lambda: encode("WEBP", lossless=True)),
    "webp-alpha": ("webp", lambda: encode("WEBP", mode="RGBA")),
    "bmp": ("bmp", lambda: encode("BMP")),
    "bmp-gray": ("bmp", lambda: encode("BMP", mode="L")),
    "gif": ("gif", lambda: encode("GIF", mode="P")),
}


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_header_gives_format_and_size(name: str) -> None:
    fmt, make = SAMPLES[name]
    data = make()
    assert check_image(data) == ImageInfo(fmt, W, H)
    assert check_image(memoryview(data)) == ImageInfo(fmt, W, H)
    assert check_image(data, level="full") == ImageInfo(fmt, W, H)


def test_jpeg_with_padding_or_trailer_after_eoi_is_whole(jpeg: bytes) -> None:
    for tail in (b"\x00" * 37, b"\n", b" \r\n", b"vendor trailer after EOI"):
        assert check_image(jpeg + tail) == ImageInfo("jpeg", W, H)


def test_bmp_top_down_rows() -> None:
    data = bytearray(encode("BMP"))
    data[22:26] = (-H).to_bytes(4, "little", signed=True)
    assert check_image(bytes(data)) == ImageInfo("bmp", W, H)


def test_level_none_never_looks() -> None:
    assert check_image(b"", level="none") is None
    assert check_image(b"garbage", level="none") is None
    with pytest.raises(ValueError, match="header"):
        check_image(b"x", level="paranoid")


def reason(data: bytes | memoryview, level: str = "header") -> str:
    with pytest.raises(ImageError) as e:
        check_image(data, level=level)
    return str(e.value)


def test_bad_files_have_clear_reasons(jpeg: bytes, png: bytes) -> None:
    assert reason(b"") == "empty file"
    assert reason(memoryview(b"")) == "empty file"
    assert reason(b"<!DOCTYPE html><html>not found</html>") == "not an image (unknown magic bytes 3c21444f)"
    assert reason(bytes(range(7, 107))) == "not an image (unknown magic bytes 0708090a)"
    assert reason(b"\x00" * 100) == "not an image (unknown magic bytes 00000000)"
    assert reason(b"\xff") == "not an image (unknown magic bytes ff)"
    assert reason(jpeg[: len(jpeg) * 2 // 3]) == "truncated JPEG: no EOI marker"
    assert reason(jpeg[:-2]) == "truncated JPEG: no EOI marker"
    assert reason(jpeg[:20]).startswith("truncated JPEG: header ends")
    assert reason(png[: len(png) // 2]) == "PNG without IEND (truncated)"
    assert reason(png[:20]).startswith("cannot read dimensions")
    webp = encode("WEBP")
    assert reason(webp[:-10]).startswith("truncated WebP")
    bmp = encode("BMP")
    assert reason(bmp[:-10]).startswith("truncated BMP")
    assert reason(b"GIF89a\x01").startswith("cannot read dimensions")


def test_zero_width_is_rejected(jpeg: bytes) -> None:
    sof = jpeg.index(b"\xff\xc0")
    bad = jpeg[: sof + 7] + b"\x00\x00" + jpeg[sof + 9:]  # width field of the frame header
    assert reason(bad) == f"bad JPEG dimensions 0x{H}"


def test_truncated_jpeg_with_exif_thumbnail_is_caught(jpeg: bytes) -> None:
    # an APP1 segment holding a whole embedded JPEG (an EXIF thumbnail) carries its own FFD9
    thumb = encode("JPEG", size=(8, 8))
    payload = b"Exif\x00\x00" + thumb
    app1 = b"\xff\xe1" + (len(payload) + 2).to_bytes(2, "big") + payload
    camera = jpeg[:2] + app1 + jpeg[2:]
    assert check_image(camera) == ImageInfo("jpeg", W, H)
    assert reason(camera[: len(camera) - 200]) == "truncated JPEG: no EOI marker"


def test_corrupt_middle_passes_header_but_not_full(jpeg: bytes) -> None:
    mid = len(jpeg) // 2
    corrupt = jpeg[:mid] + b"\xff" * 300 + jpeg[mid + 300:]
    assert check_image(corrupt) == ImageInfo("jpeg", W, H)
    assert reason(corrupt, "full").startswith("cannot decode JPEG")


def test_full_is_strict_about_corrupt_entropy_data(jpeg: bytes) -> None:
    pytest.importorskip("simplejpeg")
    mid = len(jpeg) // 2
    garbage = np.random.default_rng(1).integers(0, 255, 300, dtype=np.uint8).tobytes().replace(b"\xff", b"\x00")
    corrupt = jpeg[:mid] + garbage + jpeg[mid + 300:]  # Pillow fills this with gray, silently
    assert check_image(corrupt) == ImageInfo("jpeg", W, H)
    assert reason(corrupt, "full").startswith("cannot decode JPEG: Corrupt JPEG data")


def test_corrupt_png_data_fails_full(png: bytes) -> None:
    idat = png.index(b"IDAT") + 8
    corrupt = png[:idat] + bytes(b ^ 0x5A for b in png[idat:idat + 200]) + png[idat + 200:]
    assert check_image(corrupt) == ImageInfo("png", W, H)
    assert reason(corrupt, "full").startswith("cannot decode PNG")


def test_image_error_crosses_processes() -> None:
    e = pickle.loads(pickle.dumps(ImageError("truncated JPEG: no EOI marker")))
    assert isinstance(e, ImageError) and str(e) == "truncated JPEG: no EOI marker"


def test_extensions() -> None:
    assert EXTENSIONS == {"jpg": "jpeg", "jpeg": "jpeg", "png": "png", "webp": "webp", "bmp": "bmp"}
    assert [canonical_ext(f) for f in ("jpeg", "png", "webp", "bmp", "gif")] == ["jpg", "png", "webp", "bmp", "gif"]
    with pytest.raises(ValueError):
        canonical_ext("tiff")


def test_header_check_never_imports_pillow(tmp_path) -> None:
    path = tmp_path / "a.jpg"
    path.write_bytes(encode("JPEG", size=(500, 375)))
    code = (
        "import sys, pathlib\n"
        "from shardsmith.core.images import check_image\n"
        f"check_image(pathlib.Path({str(path)!r}).read_bytes())\n"
        "assert not any(m.startswith(('PIL', 'simplejpeg')) for m in sys.modules), 'decoder imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)


def _lines_run(fn, *args) -> int:
    """How many lines of Python ``fn(*args)`` runs, calls included: the work done, whatever the
    machine's load (a wall-clock bound would fail on a busy machine and pass a slow parser on a fast one)."""
    count = 0

    def trace(frame, event, arg):
        nonlocal count
        if event == "line":
            count += 1
        return trace

    sys.settrace(trace)
    try:
        fn(*args)
    finally:
        sys.settrace(None)
    return count


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP", "BMP"])
def test_header_check_does_not_scale_with_file_size(fmt) -> None:
    small, big = encode(fmt, size=(40, 30)), encode(fmt, size=(1600, 1200))
    assert len(big) > 20 * len(small)
    lines = _lines_run(check_image, big)
    assert lines == _lines_run(check_image, small), "work that grows with the image"
    assert lines < 200, lines  # a header's few fields: a few dozen lines


def _jpeg_outcome(parse, data: bytes) -> object:
    try:
        return parse(data)
    except ImageError as exc:
        return f"ImageError: {exc}"


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_the_jpeg_fast_path_answers_as_the_careful_walk(jpeg: bytes, data) -> None:
    """Any damage to the markers, lengths, frame header or end: the segment-at-a-time fast path
    gives the same size, or raises the same reason, as the byte-by-byte walk it hands over to."""
    from shardsmith.core.images import _jpeg, _jpeg_careful

    raw = bytearray(jpeg)
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(2, 700) | st.integers(len(raw) - 4, len(raw) - 1))
        raw[at] = data.draw(st.sampled_from([0x00, 0x01, 0x02, 0x07, 0xC0, 0xC4, 0xD0, 0xD8, 0xD9, 0xDA, 0xE0, 0xFF])
                            | st.integers(0, 255))
    cut = data.draw(st.none() | st.integers(3, len(raw)))
    blob = bytes(raw[:cut])
    assert _jpeg_outcome(_jpeg, blob) == _jpeg_outcome(lambda b: _jpeg_careful(b, 2), blob)
    assert _jpeg_outcome(_jpeg, memoryview(blob)) == _jpeg_outcome(_jpeg, blob)
