"""Offline augmentation: output sizes, determinism across instances, processes and call order, flips,
reduced-scale decoding that keeps the crop, and parse errors."""

from __future__ import annotations

import io
import math
import multiprocessing

import numpy as np
import pytest
from PIL import Image

from shardsmith.core.images import ImageError
from shardsmith.errors import UsageError
from shardsmith.transforms.augment import Augmenter, parse_augment

try:
    import simplejpeg
except ImportError:  # pragma: no cover - depends on the environment
    simplejpeg = None

ENGINES = ["pillow"] + (["simplejpeg"] if simplejpeg else [])


def photo(width: int, height: int, *, mode: str = "RGB", fmt: str = "JPEG", wave: float = 9.0) -> bytes:
    """A smooth, photo-like image (JPEG artifacts stay small), encoded with Pillow."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    arr = np.stack([255 * x / width, 255 * y / height, 128 + 100 * np.sin(x / wave) * np.cos(y / wave)], axis=-1)
    im = Image.fromarray(arr.clip(0, 255).astype(np.uint8)).convert(mode)
    buf = io.BytesIO()
    im.save(buf, fmt, quality=95)
    return buf.getvalue()


def decode(data: bytes) -> np.ndarray:
    im = Image.open(io.BytesIO(data))
    assert im.format == "JPEG" and im.mode == "RGB"
    return np.asarray(im).astype(np.int16)


@pytest.fixture(scope="module")
def jpeg() -> bytes:
    return photo(96, 64)


def aug(spec: str, **kw) -> Augmenter:
    return Augmenter(ops=parse_augment(spec), **kw)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(("spec", "size"), [
    ("resize=32", (48, 32)),
    ("resize=128", (192, 128)),
    ("center-crop=40", (40, 40)),
    ("center-crop=50x30", (50, 30)),
    ("random-crop=24", (24, 24)),
    ("random-crop=60x20", (60, 20)),
    ("random-resized-crop=32", (32, 32)),
    ("random-resized-crop=40x24", (40, 24)),
    ("hflip", (96, 64)),
    ("resize=48,center-crop=40,hflip", (40, 40)),
    ("hflip,random-resized-crop=16,resize=32", (32, 32)),
])
def test_output_size(jpeg: bytes, engine: str, spec: str, size: tuple[int, int]) -> None:
    a = aug(spec, engine=engine)
    for copy in range(3):
        out = a.apply(jpeg, identity="cat/1.jpg", copy=copy)
        assert Image.open(io.BytesIO(out)).size == size


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(("mode", "fmt"), [("L", "JPEG"), ("CMYK", "JPEG"), ("RGBA", "PNG"), ("P", "PNG"),
                                           ("RGB", "WEBP"), ("RGB", "BMP")])
def test_any_input_gives_an_rgb_jpeg(engine: str, mode: str, fmt: str) -> None:
    out = aug("center-crop=32", engine=engine).apply(photo(48, 40, mode=mode, fmt=fmt), identity="x", copy=0)
    assert decode(out).shape == (32, 32, 3)


@pytest.mark.parametrize("engine", ENGINES)
def test_same_inputs_same_bytes_across_instances(jpeg: bytes, engine: str) -> None:
    a, b = aug("random-resized-crop=32,hflip", engine=engine, seed=7), aug("random-resized-crop=32,hflip",
                                                                          engine=engine, seed=7)
    for copy in range(4):
        assert a.apply(jpeg, identity="dog/2.jpg", copy=copy) == b.apply(jpeg, identity="dog/2.jpg", copy=copy)


def test_copies_seeds_and_identities_differ(jpeg: bytes) -> None:
    a = aug("random-resized-crop=32,hflip")
    copies = {a.apply(jpeg, identity="dog/2.jpg", copy=c) for c in range(6)}
    assert len(copies) == 6
    assert a.apply(jpeg, identity="dog/3.jpg", copy=0) != a.apply(jpeg, identity="dog/2.jpg", copy=0)
    assert aug("random-resized-crop=32", seed=1).apply(jpeg, identity="d", copy=0) != \
        aug("random-resized-crop=32", seed=2).apply(jpeg, identity="d", copy=0)


def test_deterministic_ops_give_one_output_for_every_copy(jpeg: bytes) -> None:
    a = aug("resize=48,center-crop=40")
    assert not a.random and aug("center-crop=40,hflip").random
    assert len({a.apply(jpeg, identity="x", copy=c) for c in range(4)}) == 1
    assert a.apply(jpeg, identity="x", copy=0) == aug("resize=48,center-crop=40", seed=99).apply(
        jpeg, identity="other", copy=3)


def _work(args: tuple[Augmenter, bytes, str, int]) -> bytes:
    augmenter, data, identity, copy = args
    return augmenter.apply(data, identity=identity, copy=copy)


def test_same_bytes_in_two_processes_and_any_order(jpeg: bytes) -> None:
    a = aug("random-resized-crop=32,hflip", seed=3)  # pickled into fresh (spawned) workers
    jobs = [(a, jpeg, f"class{i % 3}/{i}.jpg", i % 4) for i in range(24)]
    inline = [_work(j) for j in jobs]
    assert [_work(j) for j in reversed(jobs)] == inline[::-1]
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        assert pool.map(_work, jobs, chunksize=5) == inline


def test_hflip_mirrors(jpeg: bytes) -> None:
    straight = decode(aug("hflip=0").apply(jpeg, identity="x", copy=0))
    flipped = decode(aug("hflip=1").apply(jpeg, identity="x", copy=0))
    assert np.abs(flipped - straight[:, ::-1]).mean() < 2.0
    assert np.abs(flipped - straight).mean() > 20.0
    half = aug("hflip")  # p = 0.5: both outcomes occur, and each is one of the two images
    outs = [decode(half.apply(jpeg, identity="x", copy=c)) for c in range(12)]
    is_flipped = [np.abs(o - flipped).mean() < 2.0 for o in outs]
    assert all(f or np.abs(o - straight).mean() < 2.0 for f, o in zip(is_flipped, outs))
    assert 0 < sum(is_flipped) < 12


def test_crop_then_flip_equals_flip_then_mirrored_crop(jpeg: bytes) -> None:
    a = decode(aug("hflip=1,center-crop=50x40").apply(jpeg, identity="x", copy=0))
    b = decode(aug("center-crop=50x40,hflip=1").apply(jpeg, identity="x", copy=0))
    assert np.abs(a - b).mean() < 2.0


def test_center_crop_matches_pillow_and_pads_small_images(jpeg: bytes) -> None:
    out = decode(aug("center-crop=40", engine="pillow").apply(jpeg, identity="x", copy=0))
    src = np.asarray(Image.open(io.BytesIO(jpeg)).convert("RGB")).astype(np.int16)
    assert np.abs(out - src[12:52, 28:68]).mean() < 3.0
    padded = decode(aug("center-crop=120x80").apply(jpeg, identity="x", copy=0))
    assert padded[:, :10].max() < 20 and padded[:, -10:].max() < 20  # black borders left and right
    assert np.abs(padded[8:72, 12:108] - src).mean() < 3.0


@pytest.mark.parametrize("engine", ENGINES)
def test_reduced_scale_decoding_keeps_the_crop(engine: str, monkeypatch: pytest.MonkeyPatch) -> None:
    big = photo(1024, 768, wave=40.0)  # details wider than the 1/16 scale, so no aliasing
    spec = "resize=64,center-crop=48"
    out = decode(aug(spec, engine=engine).apply(big, identity="x", copy=0))
    # reference: full-size decode, then the same operations step by step
    im = Image.open(io.BytesIO(big)).convert("RGB").resize((85, 64), Image.Resampling.BILINEAR)
    diffs = {(dx, dy): np.abs(out - np.asarray(im.crop((18 + dx, 8 + dy, 66 + dx, 56 + dy)))).mean()
             for dx in (-1, 0, 1) for dy in (-1, 0, 1)}
    assert min(diffs, key=diffs.get) == (0, 0) and diffs[0, 0] < 3.0  # no shift, only resampling
    sizes = []  # decoded at 1/8
    if engine == "simplejpeg":
        real = simplejpeg.decode_jpeg
        monkeypatch.setattr(simplejpeg, "decode_jpeg", lambda *a, **k: sizes.append(real(*a, **k).shape[1::-1])
                            or real(*a, **k))
    else:
        from PIL.JpegImagePlugin import JpegImageFile

        real_draft = JpegImageFile.draft

        def draft(self, mode, size):
            result = real_draft(self, mode, size)
            sizes.append(self.size)
            return result

        monkeypatch.setattr(JpegImageFile, "draft", draft)
    aug(spec, engine=engine).apply(big, identity="x", copy=0)
    assert sizes == [(128, 96)]


def test_random_resized_crop_plan_follows_torchvision() -> None:
    a = aug("random-resized-crop=224")
    areas, ratios = [], []
    for i in range(400):
        view = a.plan(500, 375, identity=f"img/{i}", copy=0)
        x0, y0, x1, y1 = view.box
        assert 0 <= x0 < x1 <= 500 and 0 <= y0 < y1 <= 375 and view.size == (224, 224)
        assert all(float(v).is_integer() for v in view.box)
        areas.append((x1 - x0) * (y1 - y0) / (500 * 375))
        ratios.append((x1 - x0) / (y1 - y0))
    assert min(areas) > 0.08 * 0.95 and max(areas) <= 1.0 and np.mean(areas) > 0.3
    assert min(ratios) > 0.74 and max(ratios) < 1.35
    # a very wide image never fits the ratio range: the fallback is the central crop at ratio 4/3
    view = a.plan(4000, 100, identity="wide", copy=0)
    w = view.box[2] - view.box[0]
    assert view.box[1:4:2] == (0, 100) and math.isclose(w, 133) and math.isclose(view.box[0], (4000 - 133) // 2)


@pytest.mark.parametrize("engine", ENGINES)
def test_bad_image_data_raises_image_error(jpeg: bytes, engine: str) -> None:
    a = aug("center-crop=32", engine=engine)
    for bad, why in [(jpeg[: len(jpeg) // 2], "truncated JPEG"), (b"hello, not a jpeg", "not an image"),
                     (b"", "empty file")]:
        with pytest.raises(ImageError, match=why):
            a.apply(bad, identity="x", copy=0)
    corrupt = jpeg[:200] + b"\xff" * 200 + jpeg[400:]
    with pytest.raises(ImageError, match="cannot decode JPEG"):
        a.apply(corrupt, identity="x", copy=0)


def test_parse_and_canonical_spec() -> None:
    ops = parse_augment(" Random-Resized-Crop=224 , hflip ")
    assert Augmenter(ops=ops).spec == "random-resized-crop=224,hflip"
    assert aug("resize=256,center-crop=224x200,random-crop=8,hflip=0.25").spec == \
        "resize=256,center-crop=224x200,random-crop=8,hflip=0.25"


@pytest.mark.parametrize(("spec", "named"), [
    ("rotate=90", "rotate=90"), ("resize", "resize"), ("resize=0", "resize=0"), ("resize=abc", "resize=abc"),
    ("center-crop=10x", "center-crop=10x"), ("random-crop=-3", "random-crop=-3"), ("hflip=2", "hflip=2"),
    ("resize=256,,hflip", "empty op"), ("", "empty op"), ("resize=99999", "resize=99999"),
])
def test_parse_errors_name_the_op_and_list_valid_ones(spec: str, named: str) -> None:
    with pytest.raises(UsageError) as e:
        parse_augment(spec)
    assert named in str(e.value) and "valid ops: resize=N, center-crop=N|WxH" in str(e.value)


def test_constructor_validates() -> None:
    ops = parse_augment("hflip")
    with pytest.raises(TypeError):
        Augmenter(ops)  # type: ignore[misc]
    for bad in ({"quality": 0}, {"quality": 101}, {"engine": "opencv"}, {"ops": []}):
        with pytest.raises(UsageError):
            Augmenter(**{"ops": ops, **bad})
    assert Augmenter(ops=ops).engine == ("simplejpeg" if simplejpeg else "pillow")
    d = Augmenter(ops=ops, quality=80, seed=5).describe()
    assert d["augment"] == "hflip" and d["quality"] == 80 and d["seed"] == 5 and "pillow" in d["versions"]
