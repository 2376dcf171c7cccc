"""Decode and augment in torch (shardsmith.torch_images): the crop boxes and flips are the offline
``--augment`` planning's for (seed, key, epoch), whatever the batch or the worker count; the
pixels are a Pillow render of the same box within a few levels; bad JPEG bytes are skipped and
counted, or one line of error, never a crash. nvJPEG runs only where a GPU and torchvision are."""

from __future__ import annotations

import io

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

torch = pytest.importorskip("torch")
from shardsmith.core.images import ImageError  # noqa: E402
from shardsmith.torch import (  # noqa: E402
    DecodeAugment,
    JpegCollate,
    RandomResizedCropFlip,
    TarIterable,
    decode_jpegs,
    to_model_input,
)
from shardsmith.torch_images import render  # noqa: E402
from shardsmith.transforms import augment  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the CPU path is tested here)")


def photo(width: int, height: int, *, seed: int = 0) -> bytes:
    """A smooth photo-like JPEG (its artifacts stay small)."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    w = 7.0 + seed
    arr = np.stack([255 * x / width, 255 * y / height, 128 + 100 * np.sin(x / w) * np.cos(y / w)], axis=-1)
    buf = io.BytesIO()
    Image.fromarray(arr.clip(0, 255).astype(np.uint8)).save(buf, "JPEG", quality=95)
    return buf.getvalue()


def sample(key: str, data: bytes, label: int = 0) -> dict:
    return {"__key__": key, "jpg": data, "cls": label}


SIZES = [(96, 64), (50, 80), (64, 64), (120, 45)]
SAMPLES = [sample(f"k{i:03d}", photo(*SIZES[i % 4], seed=i), i) for i in range(8)]


def cpu(**kw) -> DecodeAugment:
    return DecodeAugment(crop=RandomResizedCropFlip(32, seed=7, **kw), device="cpu")


_whole = JpegCollate(then=cpu())(SAMPLES)
WHOLE = dict(zip(_whole["key"], _whole["image"]))


@settings(max_examples=200, deadline=None)
@given(width=st.integers(1, 3000), height=st.integers(1, 3000), seed=st.integers(0, 2**64 - 1),
       key=st.text(max_size=20), epoch=st.integers(0, 10_000), size=st.integers(1, 512))
def test_boxes_and_flips_are_the_offline_augments(width, height, seed, key, epoch, size):
    offline = augment.Augmenter(ops=augment.parse_augment(f"random-resized-crop={size},hflip"), seed=seed)
    ours = RandomResizedCropFlip(size, seed=seed, epoch=epoch)
    assert ours.plan(width, height, key) == offline.plan(width, height, identity=key, copy=epoch)


def test_every_epoch_draws_fresh_crops():
    crop = RandomResizedCropFlip(32, seed=1)
    plans = []
    for epoch in range(4):
        crop.set_epoch(epoch)
        plans.append(crop.plan(500, 375, "n01/img_0001"))
    assert len(set(plans)) == 4


@pytest.mark.parametrize("path", ["uint8", "float"])
def test_pixels_match_a_pillow_render_of_the_same_box(path):
    """The CPU path interpolates uint8 (Pillow's arithmetic), the device path float (run here on
    the CPU): both within a few levels of Pillow's ``resize(box=...)``."""
    crop = RandomResizedCropFlip((40, 24), seed=3)
    worst = []
    for i, s in enumerate(SAMPLES):
        im = Image.open(io.BytesIO(s["jpg"])).convert("RGB")
        view = crop.plan(*im.size, s["__key__"])
        want = np.asarray(augment._render(im, view)).astype(np.int16)
        image = torch.from_numpy(np.array(im)).permute(2, 0, 1)
        got = render(image, view, uint8=path == "uint8").permute(1, 2, 0).numpy().astype(np.int16)
        assert got.shape == want.shape, i
        diff = np.abs(got - want)
        worst.append(diff.max())
        assert diff.mean() < 0.3, (i, view, diff.mean())
    assert max(worst) <= 3, worst


@settings(max_examples=20, deadline=None)
@given(picks=st.lists(st.integers(0, 7), min_size=1, max_size=8, unique=True))
def test_same_image_for_a_key_in_any_batch_property(picks):
    """Any subset of the samples in any order: each key's image is the one of the whole batch."""
    part = JpegCollate(then=cpu())([SAMPLES[i] for i in picks])
    assert part["key"] == [SAMPLES[i]["__key__"] for i in picks]
    assert all(torch.equal(WHOLE[k], im) for k, im in zip(part["key"], part["image"]))


def test_same_image_for_a_key_in_any_batch():
    collate = JpegCollate(then=cpu())
    whole = collate(SAMPLES)
    part = collate([SAMPLES[5], SAMPLES[2], SAMPLES[7]])
    by_key = dict(zip(whole["key"], whole["image"]))
    assert all(torch.equal(by_key[k], im) for k, im in zip(part["key"], part["image"]))
    assert whole["image"].shape == (8, 3, 32, 32) and whole["image"].dtype == torch.uint8
    assert whole["label"].tolist() == list(range(8)) and whole["skipped"] == []


def test_decodes_a_batch_of_different_sizes():
    batch = JpegCollate()(SAMPLES)
    assert batch["jpeg"].sizes == [SIZES[i % 4] for i in range(8)]
    images = decode_jpegs([batch["jpeg"][i] for i in range(8)], decoder="pillow")
    assert [tuple(im.shape) for im in images] == [(3, h, w) for w, h in batch["jpeg"].sizes]
    assert all(im.dtype == torch.uint8 for im in images)


def bad_samples() -> list[dict]:
    good = photo(64, 48)
    garbled = bytearray(good)
    garbled[300:340] = b"\xff\x00" * 20
    png = io.BytesIO()
    Image.new("RGB", (8, 8)).save(png, "PNG")
    return [sample("truncated", good[: len(good) // 2]), sample("noise", bytes(range(256)) * 4),
            sample("empty", b""), sample("png", png.getvalue()), sample("missing", None),
            sample("garbled", bytes(garbled)), sample("header-only", good[:200] + b"\xff\xd9")]


def test_bad_bytes_are_skipped_and_counted():
    out = JpegCollate(then=cpu())(SAMPLES[:2] + bad_samples() + SAMPLES[2:3])
    # Pillow decodes the garbled scan without a word (libjpeg's warnings are not errors to it)
    assert out["key"] == ["k000", "k001", "garbled", "k002"] and out["label"].tolist() == [0, 1, 0, 2]
    skipped = dict(out["skipped"])
    assert skipped.keys() == {"truncated", "noise", "empty", "png", "missing", "header-only"}
    assert out["image"].shape == (4, 3, 32, 32)
    assert all("\n" not in reason for reason in skipped.values())


@pytest.mark.parametrize("bad", bad_samples(), ids=lambda s: s["__key__"])
def test_bad_bytes_raise_one_line(bad):
    collate = JpegCollate(errors="raise", then=DecodeAugment(crop=RandomResizedCropFlip(16), errors="raise"))
    if bad["__key__"] == "garbled":  # Pillow decodes a garbled scan without a word: not an error
        return
    with pytest.raises(ImageError, match=f"^sample '{bad['__key__']}': [^\n]+$"):
        collate([SAMPLES[0], bad])


def test_all_bad_gives_an_empty_batch():
    out = JpegCollate(then=cpu())(bad_samples()[:3])
    assert out["image"].shape == (0, 3, 32, 32) and out["label"].shape == (0,) and len(out["skipped"]) == 3


def test_decoder_choice_errors(monkeypatch):
    jpegs = [torch.frombuffer(bytearray(photo(8, 8)), dtype=torch.uint8)]
    with pytest.raises(ValueError, match="not cpu"):
        decode_jpegs(jpegs, decoder="nvjpeg")
    with pytest.raises(ValueError, match="decoder='gpu'"):
        decode_jpegs(jpegs, decoder="gpu")
    import shardsmith.torch_images as ti

    monkeypatch.setattr(ti, "_torchvision_io", lambda: None)
    with pytest.raises(ImportError, match="pip install torchvision"):
        decode_jpegs(jpegs, device="cuda", decoder="nvjpeg")


def test_model_input():
    x = to_model_input(torch.full((2, 3, 4, 4), 255, dtype=torch.uint8), dtype=torch.bfloat16)
    assert x.dtype == torch.bfloat16 and x.is_contiguous(memory_format=torch.channels_last)
    assert torch.allclose(x[0, :, 0, 0].float(), torch.tensor([(1 - 0.485) / 0.229, (1 - 0.456) / 0.224,
                                                              (1 - 0.406) / 0.225]), rtol=1e-2)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """A converted ImageFolder of 24 JPEGs of several sizes."""
    from click.testing import CliRunner

    from shardsmith.cli import main

    root = tmp_path_factory.mktemp("gpu-images")
    for i in range(24):
        folder = root / "in" / f"c{i % 3}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"img{i:02d}.jpg").write_bytes(photo(*SIZES[i % 4], seed=i))
    r = CliRunner().invoke(main, ["convert", str(root / "in"), "-o", str(root / "out"), "--to", "webdataset",
                                  "--workers", "1", "-q"])
    assert r.exit_code == 0, r.output
    return root / "out"


@pytest.mark.parametrize("epoch", [0, 3])
def test_loader_images_do_not_depend_on_workers(shards, epoch):
    from shardsmith.formats.webdataset.dataset import TarDataset

    def run(workers: int) -> dict[str, torch.Tensor]:
        aug = cpu()
        aug.set_epoch(epoch)
        it = TarIterable(TarDataset(shards), batch_size=5, seed=1, epoch=epoch, collate=JpegCollate(then=aug))
        images = {}
        for b in torch.utils.data.DataLoader(it, batch_size=None, num_workers=workers):
            images.update(zip(b["key"], b["image"]))
        return images

    one, two = run(0), run(2)
    assert len(one) == 24 and one.keys() == two.keys()
    assert all(torch.equal(one[k], two[k]) for k in one)


@CUDA
def test_nvjpeg_and_device_augment_match_the_cpu_path():
    pytest.importorskip("torchvision")
    collate = JpegCollate()
    gpu = DecodeAugment(crop=RandomResizedCropFlip(32, seed=7), device="cuda", decoder="nvjpeg")
    got = gpu(collate(SAMPLES))
    want = cpu()(collate(SAMPLES))
    assert got["key"] == want["key"] and got["image"].is_cuda
    diff = (got["image"].cpu().int() - want["image"].int()).abs()
    assert diff.float().mean() < 2.0  # nvJPEG's IDCT and chroma upsampling are not libjpeg's
    bad = gpu(collate(SAMPLES[:2] + bad_samples()))
    assert bad["key"] == ["k000", "k001"]
