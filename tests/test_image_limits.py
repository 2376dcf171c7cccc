"""One pixel limit and one strictness for images (issue 13, item 14): what `convert` accepts at any
check level and when augmenting, `verify --deep` and the loader's decoders all agree; a JPEG with a
garbled scan is a bad record; bad-record errors say how to skip; Pillow's warnings stay quiet."""

from __future__ import annotations

import io
import json
import pickle
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
from conftest import jpeg, jpeg_folder, run_subprocess
from PIL import Image

from shardsmith.core.images import MAX_IMAGE_PIXELS, ImageError, check_image
from shardsmith.errors import DataError, DatasetError, UsageError
from shardsmith.transforms.augment import Augmenter, parse_augment

try:
    import simplejpeg
except ImportError:  # pragma: no cover - depends on the environment
    simplejpeg = None

HINT = "(pass --on-error skip to skip bad records)"
W, H = 48, 40  # conftest.jpeg's default size: 1,920 pixels


def with_size(data: bytes, width: int, height: int) -> bytes:
    """The JPEG with its frame header claiming another size (a 400-megapixel JPEG in a few KB)."""
    sof = data.index(b"\xff\xc0")
    return data[:sof + 5] + height.to_bytes(2, "big") + width.to_bytes(2, "big") + data[sof + 9:]


def garbled(data: bytes) -> bytes:
    """The JPEG with the middle third of its entropy-coded scan overwritten with junk (no 0xFF, so
    no marker appears): SOI, the headers, SOS and EOI are intact."""
    sos = data.index(b"\xff\xda")
    start = sos + 2 + int.from_bytes(data[sos + 2:sos + 4], "big")  # the scan's first byte
    end = len(data) - 2  # EOI
    a, b = start + (end - start) // 3, start + 2 * (end - start) // 3
    junk = np.random.default_rng(1).integers(0, 255, b - a, dtype=np.uint8).tobytes().replace(b"\xff", b"\x00")
    return data[:a] + junk + data[b:]


def palette_png_with_byte_transparency() -> bytes:
    """A palette PNG whose transparency is a byte string: Pillow's convert("RGB") warns about it."""
    rgb = np.random.default_rng(3).integers(0, 255, (H, W, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(rgb).convert("P").save(buf, "PNG", transparency=bytes([0] * 10 + [255] * 246))
    return buf.getvalue()


def convert(*args: str | Path):
    return run_subprocess("convert", "--to", "webdataset", "--workers", "1", "-q", *args)  # args may override


def manifest(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


def one_line_error(res, *, code: int = 1) -> str:
    assert res.returncode == code, res.stderr
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    return res.stderr.strip()


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return jpeg_folder(tmp_path / "in", classes=2, per_class=3)


# --------------------------------------------------------------------------- the pixel limit


def test_the_default_is_pillows_own() -> None:
    assert MAX_IMAGE_PIXELS == Image.MAX_IMAGE_PIXELS == 89_478_485


def test_a_400_megapixel_jpeg_is_over_the_limit_at_every_check_level() -> None:
    big = with_size(jpeg(0), 20000, 20000)
    for level in ("header", "full"):
        with pytest.raises(ImageError, match="20000x20000 is 400,000,000 pixels, more than the limit of "
                                             "89,478,485 \\(--max-image-pixels\\)"):
            check_image(big, level=level)
    assert check_image(big, level="header", max_pixels=400_000_000).width == 20000
    assert check_image(big, level="none", max_pixels=1) is None  # "none" reads nothing: no limit either


def test_convert_refuses_a_400_megapixel_jpeg_or_counts_it(folder: Path, tmp_path: Path) -> None:
    (folder / "c1" / "huge.jpg").write_bytes(with_size(jpeg(0), 20000, 20000))
    line = one_line_error(convert(folder, "-o", tmp_path / "out"))
    assert "c1/huge.jpg" in line and "400,000,000 pixels" in line and line.endswith(HINT)
    assert not (tmp_path / "out" / "manifest.json").exists()
    res = convert(folder, "-o", tmp_path / "skip", "--on-error", "skip")
    assert res.returncode == 0, res.stderr
    m = manifest(tmp_path / "skip")
    (entry,) = m["source"]["skipped"]["records"]
    assert entry["file"] == "c1/huge.jpg" and "--max-image-pixels" in entry["reason"]
    assert m["splits"]["train"]["samples"] == 6 and m["max_image_pixels"] == MAX_IMAGE_PIXELS


@pytest.mark.parametrize("level", ["header", "full"])
def test_convert_verify_and_loader_agree_on_the_limit(folder: Path, tmp_path: Path, level: str) -> None:
    import shardsmith

    # every image is 48x40 = 1,920 pixels: one pixel more than the limit is refused at every level
    line = one_line_error(convert(folder, "-o", tmp_path / "refused", "--check-images", level,
                                  "--max-image-pixels", str(W * H - 1)))
    assert "48x40 is 1,920 pixels, more than the limit of 1,919" in line and line.endswith(HINT)
    # let in with no check, the same limit is what verify --deep and the loader refuse
    out = tmp_path / "unchecked"
    assert convert(folder, "-o", out, "--check-images", "none", "--max-image-pixels", str(W * H - 1)).returncode == 0
    assert manifest(out)["max_image_pixels"] == W * H - 1
    res = run_subprocess("verify", out, "--deep")
    assert res.returncode == 1 and res.stdout.count("more than the limit of 1,919") == 6, res.stdout
    ds = shardsmith.open(out, split="train", decode="pil")
    assert ds.max_image_pixels == W * H - 1
    with pytest.raises(DatasetError, match="1,920 pixels, more than the limit of 1,919"):
        ds[0]
    # at the limit, all three accept
    ok = tmp_path / "ok"
    assert convert(folder, "-o", ok, "--check-images", level, "--max-image-pixels", str(W * H)).returncode == 0
    assert run_subprocess("verify", ok, "--deep").returncode == 0
    assert shardsmith.open(ok, split="train", decode="numpy")[0]["jpg"].shape == (H, W, 3)


def test_loader_decodes_up_to_the_dataset_limit_and_leaves_pillows_global_alone(
        folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shardsmith

    out = tmp_path / "out"
    assert convert(folder, "-o", out).returncode == 0
    # a user's own, lower Pillow limit: 1,920 pixels is over twice it (Pillow's error band) ...
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 500)
    ds = shardsmith.open(out, split="train", decode="pil")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no DecompressionBombWarning either
        assert ds[0]["jpg"].size == (W, H)  # ... but the dataset's limit is what decides here
    assert Image.MAX_IMAGE_PIXELS == 500  # and the user's setting is back
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)
    ds[1]
    assert Image.MAX_IMAGE_PIXELS is None


def test_max_image_pixels_is_range_checked(folder: Path, tmp_path: Path) -> None:
    from shardsmith.commands.convert import ConvertOptions

    for bad in ("0", "-5", "lots"):  # click's usage error (item 15 makes those one line)
        res = convert(folder, "-o", tmp_path / "out", "--max-image-pixels", bad)
        assert res.returncode == 2 and "--max-image-pixels" in res.stderr and "Traceback" not in res.stderr
    with pytest.raises(UsageError, match="--max-image-pixels must be a whole number >= 1"):
        ConvertOptions(inputs=("x",), out=tmp_path, max_image_pixels=0)


def test_a_bad_limit_in_a_manifest_is_a_dataset_error(folder: Path, tmp_path: Path) -> None:
    import shardsmith

    out = tmp_path / "out"
    assert convert(folder, "-o", out).returncode == 0
    m = manifest(out)
    m["max_image_pixels"] = "many"
    (out / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(DatasetError, match="'max_image_pixels' must be int, not str"):
        shardsmith.open(out, split="train", decode="pil")


# --------------------------------------------------------------------------- a garbled scan


def test_pillow_decodes_a_garbled_scan_without_a_word() -> None:
    """Why the strict decode is needed: Pillow swallows libjpeg's corrupt-data warnings."""
    bad = garbled(jpeg(5, (64, 64)))
    assert check_image(bad) is not None  # the headers and EOI are intact
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with Image.open(io.BytesIO(bad)) as im:
            im.load()  # neither raises nor warns


ENGINES = ["pillow"] + (["simplejpeg"] if simplejpeg else [])


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("spec", ["center-crop=32", "random-resized-crop=16,hflip"])  # full and reduced scale
def test_augmenting_a_garbled_scan_is_an_image_error(engine: str, spec: str) -> None:
    if simplejpeg is None:  # pragma: no cover - Pillow alone cannot see a garbled scan (README)
        pytest.skip("needs simplejpeg")
    a = Augmenter(ops=parse_augment(spec), engine=engine)
    good = jpeg(5, (64, 64))
    a.apply(good, identity="x", copy=0)
    with pytest.raises(ImageError, match="cannot decode JPEG: Corrupt JPEG data"):
        a.apply(garbled(good), identity="x", copy=0)


def test_augmenting_a_garbled_scan_fails_naming_the_file_or_is_counted(folder: Path, tmp_path: Path) -> None:
    if simplejpeg is None:  # pragma: no cover
        pytest.skip("needs simplejpeg")
    (folder / "c0" / "garbled.jpg").write_bytes(garbled(jpeg(5, (64, 64))))
    aug = ("--augment", "center-crop=32")
    line = one_line_error(convert(folder, "-o", tmp_path / "out", *aug))
    assert "c0/garbled.jpg" in line and "Corrupt JPEG data" in line and line.endswith(HINT)
    assert convert(folder, "-o", tmp_path / "skip", *aug, "--on-error", "skip").returncode == 0
    m = manifest(tmp_path / "skip")
    assert [e["file"] for e in m["source"]["skipped"]["records"]] == ["c0/garbled.jpg"]
    assert m["splits"]["train"]["samples"] == 6


def test_full_check_and_verify_deep_catch_a_garbled_scan(folder: Path, tmp_path: Path) -> None:
    if simplejpeg is None:  # pragma: no cover
        pytest.skip("needs simplejpeg")
    (folder / "c0" / "garbled.jpg").write_bytes(garbled(jpeg(5, (64, 64))))
    line = one_line_error(convert(folder, "-o", tmp_path / "full", "--check-images", "full"))
    assert "c0/garbled.jpg" in line and "Corrupt JPEG data" in line
    assert convert(folder, "-o", tmp_path / "out").returncode == 0  # the header check lets it in
    res = run_subprocess("verify", tmp_path / "out", "--deep")
    assert res.returncode == 1 and res.stdout.count("Corrupt JPEG data") == 1, res.stdout


# --------------------------------------------------------------------------- small things


def test_every_converters_bad_record_error_says_how_to_skip(tmp_path: Path) -> None:
    (tmp_path / "docs.jsonl").write_text('{"text": "a"}\nnot json\n')
    line = one_line_error(convert(tmp_path / "docs.jsonl", "-o", tmp_path / "out"))
    assert "docs.jsonl: line 2" in line and line.endswith(HINT)
    folder = jpeg_folder(tmp_path / "in", classes=1, per_class=2)
    (folder / "c0" / "empty.jpg").write_bytes(b"")
    # the direct path, in this process and in workers; the general one
    for extra in ((), ("--workers", "2", "--shard-samples", "1"), ("--augment", "center-crop=8")):
        line = one_line_error(convert(folder, "-o", tmp_path / "img", *extra))
        assert "c0/empty.jpg" in line and "empty file" in line and line.endswith(HINT)


def test_the_hint_crosses_processes() -> None:
    e = pickle.loads(pickle.dumps(DataError(file="a.jpg", reason="empty file", unit="image", skippable=True)))
    assert str(e) == f"a.jpg: empty file {HINT}" and e.skippable
    assert str(pickle.loads(pickle.dumps(DataError(file="a.jpg", reason="changed")))) == "a.jpg: changed"


def test_pillow_warnings_do_not_pass_quiet(tmp_path: Path) -> None:
    folder = jpeg_folder(tmp_path / "in", classes=1, per_class=2)
    (folder / "c0" / "palette.png").write_bytes(palette_png_with_byte_transparency())
    with warnings.catch_warnings(record=True) as seen:  # the warning this test is about
        warnings.simplefilter("always")
        Image.open(io.BytesIO(palette_png_with_byte_transparency())).convert("RGB")
    assert any("Transparency" in str(w.message) for w in seen)
    for extra in (("--augment", "center-crop=32"), ("--check-images", "full")):
        res = convert(folder, "-o", tmp_path / extra[0].strip("-"), *extra)
        assert res.returncode == 0 and res.stderr == "", res.stderr


def test_an_image_that_changed_size_since_the_listing_ends_the_run(tmp_path: Path) -> None:
    from shardsmith.core.input_file import InputFile
    from shardsmith.engine.copying.image_copy import plan_shards, write_all
    from shardsmith.formats.webdataset.image_tar import TarCopier
    from shardsmith.kit.image_processor import ImageProcessor
    from shardsmith.kit.sample import NeutralEncoder

    data = jpeg(1)
    from shardsmith.commands.convert import ConvertOptions

    opts = ConvertOptions(inputs=("x",), out=tmp_path, check_images="none")
    processor = ImageProcessor(classes=["c"], opts=opts, encoder=NeutralEncoder())  # (the copy mode encodes none)
    copier = TarCopier(shard_samples=None, shard_bytes=1 << 20, wids_md5=False)
    cases = {"truncated": (data[:100], len(data), "changed while converting: 100 bytes, was"),
             "grown": (data + b"more", len(data), f"changed while converting: more than {len(data)} bytes"),
             "listed empty": (data, 0, "changed while converting: more than 0 bytes, was 0")}
    for name, (now, listed, reason) in cases.items():
        path = tmp_path / "c" / f"{name}.jpg"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(now)
        files = [InputFile(path=str(path), rel=f"c/{name}.jpg", index=0, size=listed, group="c")]
        out = tmp_path / name
        out.mkdir()
        plans = plan_shards(files, copier=copier, seed=0, shuffle=True, splits=(("train", 1.0),), out_dir=out)
        with pytest.raises(DataError) as err:
            write_all(plans, copier=copier, images=processor, workers=1, progress=lambda n: None, out_dir=out)
        assert str(err.value).startswith(f"c/{name}.jpg: {reason}") and HINT not in str(err.value), name
        assert not list(out.glob("*.tar")), name
    # a file gone since the listing cannot be read: a bad record there, as on the general path
    gone = InputFile(path=str(tmp_path / "c" / "gone.jpg"), rel="c/gone.jpg", index=0, size=10, group="c")
    plans = plan_shards([gone], copier=copier, seed=0, shuffle=True, splits=(("train", 1.0),), out_dir=tmp_path)
    with pytest.raises(DataError, match=f"^c/gone.jpg: cannot read: No such file or directory {re.escape(HINT)}$"):
        write_all(plans, copier=copier, images=processor, workers=1, progress=lambda n: None, out_dir=tmp_path)
