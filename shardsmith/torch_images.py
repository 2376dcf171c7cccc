"""Image batches of tar shards decoded and augmented by torch, on the GPU or in DataLoader workers,
with the crops and flips of the offline ``--augment`` (``transforms/augment_ops.py``).

The loader ships a batch's JPEG bytes as they are (``JpegCollate``: one flat uint8 tensor and
offsets, sizes read from the headers); ``DecodeAugment`` decodes them (nvJPEG through
``torchvision.io.decode_jpeg`` on CUDA, Pillow elsewhere) and cuts each image's crop with one
antialiased bilinear resample, then the flip. Run it as a ``DevicePrefetcher`` transform for the
GPU, or as ``JpegCollate(then=...)`` in the workers for the CPU.

Seeding: the crop box and the flip of a sample are drawn as ``--augment
"random-resized-crop=S,hflip" --seed SEED`` draws them for identity ``__key__`` and copy
``epoch`` (``draw_key(seed, key, epoch)``): a pure function of (seed, key, epoch), so every epoch
draws fresh crops, the same for any batch composition, worker count or device; the boxes equal
the CPU planning exactly, the pixels a Pillow render of the same box within a few levels.

Details: ``JpegCollate``'s flat tensor is one shared-memory block between processes; the sizes come
from ``check_image(level="header")``, so a bad or oversized image is skipped and listed there, in the
worker. nvJPEG decodes a batch in one call (``torchvision.io.decode_jpeg(list, device=cuda)``); a
batch that fails is decoded one by one to find the bad images. Each crop is rendered with one
antialiased bilinear resample (Pillow's ``resize(box=...)``; uint8 on a CPU, float on the GPU), then
the flip. The boxes and flips equal ``Augmenter.plan`` exactly for ``"random-resized-crop=S,hflip"``
(the same ``RandomResizedCrop`` and ``HFlip`` ops); pixels match a Pillow render of the box within 3
levels (nvJPEG's IDCT and chroma upsampling differ from libjpeg's a little more). torchvision is
imported only when nvJPEG is asked for; ``import shardsmith.torch`` needs neither it nor Pillow.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardsmith.torch_extra import torch_missing

try:
    import torch
except ImportError:
    raise torch_missing(__name__) from None

from shardsmith.core.images import MAX_IMAGE_PIXELS, ImageError, check_image, pillow_open
from shardsmith.transforms.augment_ops import HFlip, RandomResizedCrop, View, _Draws, draw_key

__all__ = ["DecodeAugment", "JpegBatch", "JpegCollate", "RandomResizedCropFlip", "decode_jpegs", "render",
           "to_model_input"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
DECODERS = ("auto", "nvjpeg", "pillow")


@dataclass
class JpegBatch:
    """A batch's encoded images as one flat uint8 tensor (one shared-memory block between
    processes, not one per image): image i is ``data[offsets[i]:offsets[i + 1]]``, of ``sizes[i]``
    (width, height) by its header; ``keys`` are the samples' ``__key__``."""

    data: torch.Tensor
    offsets: list[int]
    sizes: list[tuple[int, int]]
    keys: list[str]

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.data[self.offsets[i]:self.offsets[i + 1]]


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


class JpegCollate:
    """A ``TarIterable(collate=...)``: samples into ``{"jpeg": JpegBatch, "label": (n,) int64,
    "skipped": [(key, reason)]}``; an image whose header is bad or too large is skipped (listed)
    or, with ``errors="raise"``, an ImageError of one line. ``then`` (e.g. a CPU ``DecodeAugment``)
    runs on the result, in the worker."""

    def __init__(self, *, field: str = "jpg", label: str | None = "cls", errors: str = "skip",
                 max_pixels: int = MAX_IMAGE_PIXELS, then: Callable[[dict[str, Any]], Any] | None = None) -> None:
        if errors not in ("skip", "raise"):
            raise ValueError(f"errors={errors!r}: choose 'skip' or 'raise'")
        self.field, self.label, self.errors, self.max_pixels, self.then = field, label, errors, max_pixels, then

    def __call__(self, samples: list[dict[str, Any]]) -> Any:
        keep, sizes, skipped = [], [], []
        for s in samples:
            key, data = str(s.get("__key__")), s.get(self.field)
            try:
                if not isinstance(data, (bytes, bytearray, memoryview)):
                    raise ImageError(f"no {self.field!r} bytes in the sample")
                info = check_image(data, level="header", max_pixels=self.max_pixels)
                if info.format != "jpeg":
                    raise ImageError(f"a {info.format.upper()}, not a JPEG")
            except ImageError as e:
                if self.errors == "raise":
                    raise ImageError(f"sample {key!r}: {_one_line(e)}") from None
                skipped.append((key, _one_line(e)))
                continue
            keep.append(s)
            sizes.append((info.width, info.height))
        offsets = np.zeros(len(keep) + 1, dtype=np.int64)
        np.cumsum([len(s[self.field]) for s in keep], out=offsets[1:])
        flat = np.empty(int(offsets[-1]), dtype=np.uint8)
        for s, a, b in zip(keep, offsets[:-1], offsets[1:]):
            flat[a:b] = np.frombuffer(s[self.field], dtype=np.uint8)
        jpeg = JpegBatch(torch.from_numpy(flat), offsets.tolist(), sizes, [str(s["__key__"]) for s in keep])
        out: dict[str, Any] = {"jpeg": jpeg, "skipped": skipped}
        if self.label is not None:
            out["label"] = torch.tensor([int(s[self.label]) for s in keep], dtype=torch.int64)
        return self.then(out) if self.then is not None else out


def decode_jpegs(jpegs: Sequence[torch.Tensor], *, device: str | torch.device = "cpu", decoder: str = "auto",
                 max_pixels: int = MAX_IMAGE_PIXELS) -> list[torch.Tensor | ImageError]:
    """Each JPEG (1-D uint8 CPU tensors) as an RGB uint8 (3, H, W) tensor on ``device``, or the
    ImageError that says why not. ``decoder``: "nvjpeg" (``torchvision.io.decode_jpeg`` on a CUDA
    device, the batch at once), "pillow" (here, one by one), "auto" (nvjpeg where it can run)."""
    device = torch.device(device)
    if decoder not in DECODERS:
        raise ValueError(f"decoder={decoder!r}: choose one of {DECODERS}")
    if decoder == "nvjpeg" or (decoder == "auto" and device.type == "cuda" and _torchvision_io() is not None):
        if device.type != "cuda":
            raise ValueError(f"decoder='nvjpeg' decodes on a CUDA device, not {device}")
        io = _torchvision_io()
        if io is None:
            raise ImportError("decoder='nvjpeg' needs torchvision: pip install torchvision")
        return _nvjpeg(io, list(jpegs), device)
    out: list[torch.Tensor | ImageError] = []
    for data in jpegs:
        try:
            with pillow_open(memoryview(data.numpy()), max_pixels=max_pixels, quiet=True) as im:
                rgb = np.array(im.convert("RGB"))  # writable: torch warns of a read-only array
        except ImageError as e:
            out.append(e)
        except Exception as e:  # Pillow raises OSError, SyntaxError, ValueError, ...
            out.append(ImageError(f"cannot decode JPEG: {_one_line(e)}"))
        else:
            out.append(torch.from_numpy(rgb).permute(2, 0, 1).to(device))
    return out


def _torchvision_io() -> Any:
    try:
        import torchvision.io as io
    except (ImportError, RuntimeError):  # RuntimeError: a torchvision built for another torch
        return None
    return io


def _nvjpeg(io: Any, jpegs: list[torch.Tensor], device: torch.device) -> list[torch.Tensor | ImageError]:
    try:
        return list(io.decode_jpeg(jpegs, mode=io.ImageReadMode.RGB, device=device))
    except RuntimeError:  # a bad image fails the whole batch: find which, one by one
        out: list[torch.Tensor | ImageError] = []
        for data in jpegs:
            try:
                out.append(io.decode_jpeg(data, mode=io.ImageReadMode.RGB, device=device))
            except RuntimeError as e:
                out.append(ImageError(f"cannot decode JPEG: {_one_line(e)}"))
        return out


class RandomResizedCropFlip:
    """torchvision's ``RandomResizedCrop(size)`` + ``RandomHorizontalFlip(p)``, drawn as ``--augment``
    draws them (see the module): ``plan`` is the CPU planning itself; ``__call__`` renders on the
    images' device. ``set_epoch`` changes the copy number that the draws are keyed by."""

    def __init__(self, size: int | tuple[int, int] = 224, *, seed: int = 0, scale: tuple[float, float] = (0.08, 1.0),
                 ratio: tuple[float, float] = (3 / 4, 4 / 3), p: float = 0.5, epoch: int = 0) -> None:
        width, height = (size, size) if isinstance(size, int) else size
        self.size = (width, height)
        self.seed = seed
        self.epoch = epoch
        self.ops = (RandomResizedCrop(width, height, tuple(scale), tuple(ratio)), HFlip(p))

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def plan(self, width: int, height: int, key: str) -> View:
        """The source box, output size and flip of sample ``key`` (an image of this size) this epoch."""
        draws = _Draws(draw_key(self.seed, key, self.epoch))
        view = View((0.0, 0.0, float(width), float(height)), (width, height))
        for op in self.ops:
            view = op.plan(view, draws)
        return view

    def __call__(self, images: Sequence[torch.Tensor], keys: Sequence[str]) -> torch.Tensor:
        """(N, 3, H, W) uint8 from N uint8 (3, h, w) images of any sizes."""
        width, height = self.size
        if not images:
            return torch.empty((0, 3, height, width), dtype=torch.uint8)
        return torch.stack([render(im, self.plan(im.shape[-1], im.shape[-2], key)) for im, key in zip(images, keys)])


def render(image: torch.Tensor, view: View, *, uint8: bool | None = None) -> torch.Tensor:
    """``view``'s box of a uint8 (C, h, w) image at ``view.size``, flipped if it says so: Pillow's
    ``resize(size, BILINEAR, box=box)`` (``augment._render``) in torch. Boxes of whole pixels inside
    the image only (what ``RandomResizedCrop`` plans on a source image). ``uint8``: interpolate in
    torch's uint8 arithmetic (Pillow's, vectorised; CPU only) rather than float (default: on a CPU)."""
    x0, y0, x1, y1 = view.box
    if not all(float(v).is_integer() for v in view.box) or x0 < 0 or y0 < 0 or x1 > image.shape[-1] \
            or y1 > image.shape[-2]:
        raise ValueError(f"render: box {view.box} is not of whole pixels inside a {tuple(image.shape)} image")
    crop = image[:, int(y0):int(y1), int(x0):int(x1)]
    width, height = view.size
    if crop.shape[-2:] != (height, width):
        if crop.device.type == "cpu" if uint8 is None else uint8:
            crop = torch.nn.functional.interpolate(crop[None].contiguous(), size=(height, width), mode="bilinear",
                                                   antialias=True, align_corners=False)[0]
        else:
            crop = torch.nn.functional.interpolate(crop[None].float(), size=(height, width), mode="bilinear",
                                                   antialias=True, align_corners=False)[0]
            crop = crop.round_().clamp_(0, 255).to(torch.uint8)
    return crop.flip(-1) if view.flip else crop


class DecodeAugment:
    """A ``JpegCollate`` batch into ``{"image", "label", "key", "skipped"}`` on ``device``: decoded
    (``decode_jpegs``), cropped and flipped (``crop``), and with ``normalize`` scaled to ``dtype``
    with the ImageNet mean and std (``channels_last``: the memory format convnets run fastest in).
    Undecodable images are skipped and listed in ``skipped``, or with ``errors="raise"`` an
    ImageError of one line. Use as ``DevicePrefetcher(..., transform=DecodeAugment(...))``."""

    def __init__(self, *, crop: RandomResizedCropFlip, device: str | torch.device = "cpu", decoder: str = "auto",
                 errors: str = "skip", normalize: bool = False, dtype: torch.dtype = torch.float32,
                 channels_last: bool = False, max_pixels: int = MAX_IMAGE_PIXELS) -> None:
        if errors not in ("skip", "raise"):
            raise ValueError(f"errors={errors!r}: choose 'skip' or 'raise'")
        self.crop, self.device, self.decoder, self.errors = crop, torch.device(device), decoder, errors
        self.normalize, self.dtype, self.channels_last, self.max_pixels = normalize, dtype, channels_last, max_pixels

    def set_epoch(self, epoch: int) -> None:
        self.crop.set_epoch(epoch)

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        jpeg: JpegBatch = batch["jpeg"]
        decoded = decode_jpegs([jpeg[i] for i in range(len(jpeg))], device=self.device, decoder=self.decoder,
                               max_pixels=self.max_pixels)
        good = [i for i, d in enumerate(decoded) if not isinstance(d, ImageError)]
        skipped = list(batch.get("skipped", []))
        for i, d in enumerate(decoded):
            if isinstance(d, ImageError):
                if self.errors == "raise":
                    raise ImageError(f"sample {jpeg.keys[i]!r}: {_one_line(d)}")
                skipped.append((jpeg.keys[i], _one_line(d)))
        keys = [jpeg.keys[i] for i in good]
        image = self.crop([decoded[i] for i in good], keys).to(self.device)
        if self.normalize:
            image = to_model_input(image, dtype=self.dtype, channels_last=self.channels_last)
        elif self.channels_last:
            image = image.contiguous(memory_format=torch.channels_last)
        out = {"image": image, "key": keys, "skipped": skipped}
        if "label" in batch:
            label = batch["label"]
            out["label"] = label[torch.tensor(good, dtype=torch.int64, device=label.device)] \
                if len(good) < len(label) else label
        return out


def to_model_input(image: torch.Tensor, *, mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD,
                   dtype: torch.dtype = torch.float32, channels_last: bool = True) -> torch.Tensor:
    """uint8 (N, 3, H, W) into ``(x / 255 - mean) / std`` of ``dtype``, on its device."""
    m = torch.tensor(mean, device=image.device).view(1, -1, 1, 1) * 255
    s = torch.tensor(std, device=image.device).view(1, -1, 1, 1) * 255
    x = ((image.float() - m) / s).to(dtype)
    return x.contiguous(memory_format=torch.channels_last) if channels_last else x
