"""Deterministic synthetic ImageFolder of JPEGs for the convert benchmarks (issue 3).

    python bench/images.py --n 20000 -o /tmp/shardsmith-bench/imagefolder [--classes 100] [--seed 0]

Writes OUT/CLASS/CLASS_NNNNNNN.jpg, classes named like ImageNet's (``n01000000`` ...), images dealt
round-robin to classes. Each image looks like an ImageNet thumbnail as far as JPEG is concerned:
mostly 500x375 (some 375x500 and 500x333), smooth colour gradients (a few upsampled random fields)
plus mid-frequency texture and pixel noise, encoded at quality 85 with 4:2:0 chroma subsampling,
about 27 KB on average (20,000 images ~ 540 MB). The bytes depend only on (--seed, image number),
never on the number of processes. Written into OUT.tmp and renamed when whole; OUT/.bench-images.json
records the parameters so that callers can reuse a folder that is already there.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

QUALITY = 85
SIZES = [(500, 375)] * 14 + [(375, 500)] * 4 + [(500, 333)] * 2  # (width, height), weights by repetition
MARKER = ".bench-images.json"
DETAIL, NOISE = 0.1, 3.0  # texture amplitude and grain sigma (medians): tuned for ~27 KB per image


def class_names(classes: int) -> list[str]:
    return [f"n{1_000_000 + 7919 * c:08d}" for c in range(classes)]


def _upsampled(rng: np.random.Generator, shape: tuple[int, int], channels: int, width: int, height: int,
               scale: float) -> np.ndarray:
    """A random field of `shape` (h, w) cells, bicubically upsampled to (height, width, channels) float32."""
    from PIL import Image

    small = (rng.random((*shape, channels), dtype=np.float32) * 255).astype(np.uint8)
    im = Image.fromarray(small[..., 0] if channels == 1 else small)
    big = np.asarray(im.resize((width, height), Image.Resampling.BICUBIC), dtype=np.float32)
    return (big.reshape(height, width, channels) - 127.5) * scale


def make_image(seed: int, index: int) -> bytes:
    """The JPEG bytes of image `index`: a pure function of (seed, index)."""
    import simplejpeg

    rng = np.random.default_rng([seed, index])
    width, height = SIZES[int(rng.integers(len(SIZES)))]
    small = (int(rng.integers(2, 5)), int(rng.integers(2, 5)))
    lum = _upsampled(rng, small, 1, width, height, 0.9)[..., 0]  # lighting
    lum += _upsampled(rng, (int(rng.integers(6, 14)), int(rng.integers(8, 18))), 1, width, height, 0.5)[..., 0]  # shapes
    detail = float(rng.lognormal(np.log(DETAIL), 0.35))  # how textured this image is: drives its size
    lum += _upsampled(rng, (height // 5, width // 5), 1, width, height, detail)[..., 0]  # texture
    noise = float(rng.lognormal(np.log(NOISE), 0.3))
    lum += rng.standard_normal((height, width), dtype=np.float32) * noise  # grain
    img = _upsampled(rng, small, 3, width, height, 0.35)  # colour shifts
    img += rng.uniform(60, 190, 3).astype(np.float32)  # the scene's tint
    img += lum[..., None]
    np.clip(img, 0, 255, out=img)
    return simplejpeg.encode_jpeg(img.astype(np.uint8), quality=QUALITY, colorspace="RGB",
                                  colorsubsampling="420")


def _keep_freed_memory() -> None:
    """Keep freed blocks in the heap (as shardsmith.core.memory does): a fresh page costs ~3 us to fault in
    on these VMs, and each image allocates ~10 MB of temporaries."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt(-3, 512 << 20)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, (1 << 31) - 1)  # M_TRIM_THRESHOLD
    except (OSError, AttributeError):
        pass


def _write_range(args: tuple[str, int, int, int, int]) -> int:
    out, seed, classes, start, stop = args
    names = class_names(classes)
    total = 0
    for i in range(start, stop):
        name = names[i % classes]
        data = make_image(seed, i)
        with open(os.path.join(out, name, f"{name}_{i:07d}.jpg"), "wb") as f:
            f.write(data)
        total += len(data)
    return total


def write_imagefolder(out: Path, n: int, *, classes: int = 100, seed: int = 0, workers: int | None = None) -> dict:
    """Write the folder (replacing an incomplete one); returns the parameters and total size."""
    out = Path(out)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    for name in class_names(classes):
        (tmp / name).mkdir(parents=True)
    step = 250
    jobs = [(str(tmp), seed, classes, s, min(s + step, n)) for s in range(0, n, step)]
    workers = workers or os.cpu_count() or 1
    t0 = time.perf_counter()
    with multiprocessing.get_context("fork").Pool(workers, initializer=_keep_freed_memory) as pool:
        total = sum(pool.imap_unordered(_write_range, jobs))
    info = {"n": n, "classes": classes, "seed": seed, "quality": QUALITY, "bytes": total,
            "seconds": round(time.perf_counter() - t0, 2)}
    (tmp / MARKER).write_text(json.dumps(info))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return info


def ensure_imagefolder(out: Path, n: int, *, classes: int = 100, seed: int = 0) -> dict:
    """The folder's parameters, writing it first unless a complete one with these parameters exists."""
    marker = Path(out) / MARKER
    if marker.exists():
        info = json.loads(marker.read_text())
        if (info["n"], info["classes"], info["seed"], info.get("quality")) == (n, classes, seed, QUALITY):
            return info
    return write_imagefolder(Path(out), n, classes=classes, seed=seed)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20_000, help="number of images (default 20,000)")
    ap.add_argument("--classes", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-o", "--out", type=Path, default=Path("/tmp/shardsmith-bench/imagefolder"))
    ap.add_argument("--workers", type=int, default=None, help="processes (default: all cores)")
    args = ap.parse_args(argv)
    info = write_imagefolder(args.out, args.n, classes=args.classes, seed=args.seed, workers=args.workers)
    print(f"{args.out}: {info['n']:,} JPEGs in {info['classes']} classes, {info['bytes'] / 1e6:.1f} MB "
          f"({info['bytes'] / info['n'] / 1e3:.1f} KB each), {info['seconds']:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
