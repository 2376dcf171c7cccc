"""The augmentation ops and what they stand on: counter-mode blake2b draws keyed by (seed, identity,
copy), and the ``View`` each op plans on, in source coordinates, before any pixel is touched."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import ClassVar

# --------------------------------------------------------------------------- randomness


class _Draws:
    """Uniform draws in [0, 1): blake2b in counter mode under a key, 8 draws per block."""

    def __init__(self, key: bytes) -> None:
        self._key = key
        self._block = 0
        self._buf: list[int] = []

    def random(self) -> float:
        if not self._buf:
            digest = hashlib.blake2b(self._block.to_bytes(8, "little"), digest_size=64, key=self._key).digest()
            self._block += 1
            self._buf = [int.from_bytes(digest[i:i + 8], "little") >> 11 for i in range(56, -8, -8)]
        return self._buf.pop() / 9007199254740992.0  # 53 bits

    def uniform(self, low: float, high: float) -> float:
        return low + (high - low) * self.random()

    def below(self, n: int) -> int:
        """An integer in [0, n)."""
        return min(int(self.random() * n), n - 1)


def draw_key(seed: int, identity: str, copy: int) -> bytes:
    """The key of one variant's draws; the integers hold no ':', so the message is unambiguous."""
    message = f"{seed}:{copy}:".encode() + identity.encode("utf-8")
    return hashlib.blake2b(message, digest_size=32, person=b"shardsmith.aug").digest()


# --------------------------------------------------------------------------- planning


@dataclass(frozen=True)
class View:
    """The image the chain has produced so far: its size and the source box it shows."""

    box: tuple[float, float, float, float]  # in source pixels; may reach outside (black padding)
    size: tuple[int, int]
    flip: bool = False

    def crop(self, left: float, top: float, width: int, height: int, *, size: tuple[int, int] | None = None) -> View:
        w, h = self.size
        if self.flip:  # a crop of the mirrored image is the mirrored crop of the image
            left = w - left - width
        x0, y0, x1, y1 = self.box
        sx, sy = (x1 - x0) / w, (y1 - y0) / h
        box = (x0 + left * sx, y0 + top * sy, x0 + (left + width) * sx, y0 + (top + height) * sy)
        return View(tuple(_snap(v) for v in box), size or (width, height), self.flip)


def _snap(v: float) -> float:
    r = round(v)
    return float(r) if abs(v - r) < 1e-6 else v


class Op:
    """One augmentation step, applied to the plan rather than to pixels."""

    random: ClassVar[bool] = False

    def plan(self, view: View, draws: _Draws | None) -> View:
        raise NotImplementedError


def _size_str(width: int, height: int) -> str:
    return str(width) if width == height else f"{width}x{height}"


@dataclass(frozen=True)
class Resize(Op):
    """Shorter side to ``size``, aspect kept (torchvision ``Resize(int)``: the longer side truncated)."""

    size: int

    def plan(self, view: View, draws: _Draws | None) -> View:
        w, h = view.size
        if w <= h:
            size = (self.size, max(1, int(self.size * h / w)))
        else:
            size = (max(1, int(self.size * w / h)), self.size)
        return View(view.box, size, view.flip)

    def __str__(self) -> str:
        return f"resize={self.size}"


@dataclass(frozen=True)
class CenterCrop(Op):
    """torchvision ``CenterCrop``: pads with black where the image is smaller than the crop."""

    width: int
    height: int

    def plan(self, view: View, draws: _Draws | None) -> View:
        w, h = view.size
        return view.crop(_centered(w, self.width), _centered(h, self.height), self.width, self.height)

    def __str__(self) -> str:
        return f"center-crop={_size_str(self.width, self.height)}"


def _centered(have: int, want: int) -> int:
    return int(round((have - want) / 2.0)) if have >= want else -((want - have) // 2)


@dataclass(frozen=True)
class RandomCrop(Op):
    """torchvision ``RandomCrop``; a side smaller than the crop is padded with black, centered."""

    width: int
    height: int
    random: ClassVar[bool] = True

    def plan(self, view: View, draws: _Draws | None) -> View:
        w, h = view.size
        top = draws.below(h - self.height + 1) if h >= self.height else _centered(h, self.height)
        left = draws.below(w - self.width + 1) if w >= self.width else _centered(w, self.width)
        return view.crop(left, top, self.width, self.height)

    def __str__(self) -> str:
        return f"random-crop={_size_str(self.width, self.height)}"


@dataclass(frozen=True)
class RandomResizedCrop(Op):
    """torchvision ``RandomResizedCrop.get_params``: 10 tries, then the central crop within ``ratio``."""

    width: int
    height: int
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    random: ClassVar[bool] = True

    def plan(self, view: View, draws: _Draws | None) -> View:
        width, height = view.size
        area = width * height
        log_ratio = (math.log(self.ratio[0]), math.log(self.ratio[1]))
        for _ in range(10):
            target_area = area * draws.uniform(*self.scale)
            aspect = math.exp(draws.uniform(*log_ratio))
            w = int(round(math.sqrt(target_area * aspect)))
            h = int(round(math.sqrt(target_area / aspect)))
            if 0 < w <= width and 0 < h <= height:
                top = draws.below(height - h + 1)
                left = draws.below(width - w + 1)
                return view.crop(left, top, w, h, size=(self.width, self.height))
        in_ratio = width / height
        w, h = width, height
        if in_ratio < min(self.ratio):
            h = int(round(w / min(self.ratio)))
        elif in_ratio > max(self.ratio):
            w = int(round(h * max(self.ratio)))
        return view.crop((width - w) // 2, (height - h) // 2, w, h, size=(self.width, self.height))

    def __str__(self) -> str:
        return f"random-resized-crop={_size_str(self.width, self.height)}"


@dataclass(frozen=True)
class HFlip(Op):
    """Mirror left-right with probability ``p``."""

    p: float = 0.5
    random: ClassVar[bool] = True

    def plan(self, view: View, draws: _Draws | None) -> View:
        if draws.random() < self.p:
            return View(view.box, view.size, not view.flip)
        return view

    def __str__(self) -> str:
        return "hflip" if self.p == 0.5 else f"hflip={self.p:g}"
