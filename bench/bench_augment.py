"""Augmentation throughput per core: `Augmenter.apply` vs a bare simplejpeg + Pillow loop (issue 3).

    python bench/bench_augment.py [--images 500] [--rounds 3] [--spec "random-resized-crop=224,hflip"]

Both sides run in this one process (one core, CPU time), alternating, on the same deterministic 500x375 JPEGs
(smooth random fields plus grain, quality 90, made here). The bare loop does the same operations the
way a user would write them: simplejpeg decode, Pillow resize with a crop box, flip, simplejpeg encode
at the same quality and 4:2:0 chroma. For random ops it is handed the very crop boxes and flips the
Augmenter draws (computed before timing), so both sides do identical pixel work.
Issue 3 asks for the Augmenter within 1.2x of the bare loop's images/s.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import time
from collections.abc import Callable

import numpy as np
import simplejpeg
from harness import verdict
from PIL import Image

from shardsmith.transforms.augment import Augmenter, parse_augment

SIZE = (500, 375)


def make_jpegs(n: int, *, seed: int = 0, quality: int = 90) -> list[bytes]:
    """Deterministic photo-like JPEGs: a bicubic-upsampled random field plus grain."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        coarse = Image.fromarray(rng.integers(0, 256, (6, 8, 3), dtype=np.uint8))
        smooth = np.asarray(coarse.resize(SIZE, Image.Resampling.BICUBIC), dtype=np.int16)
        grain = rng.normal(0.0, 8.0, smooth.shape).astype(np.int16)
        buf = io.BytesIO()
        Image.fromarray(np.clip(smooth + grain, 0, 255).astype(np.uint8)).save(buf, "JPEG", quality=quality)
        out.append(buf.getvalue())
    return out


def identity(i: int) -> str:
    return f"train/{i:06d}.jpg"


def bare_loop(spec: str, quality: int, plans: list) -> Callable[[list[bytes]], None]:
    """The hand-written loop for the two standard specs; ``plans`` hold the random draws."""

    def rrc_hflip(images: list[bytes]) -> None:
        for data, plan in zip(images, plans):
            im = Image.fromarray(simplejpeg.decode_jpeg(data, colorspace="RGB"))
            im = im.resize((224, 224), Image.Resampling.BILINEAR, box=plan.box)
            if plan.flip:
                im = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
            simplejpeg.encode_jpeg(np.asarray(im), quality=quality, colorspace="RGB", colorsubsampling="420")

    def resize_center(images: list[bytes]) -> None:
        for data in images:
            im = Image.fromarray(simplejpeg.decode_jpeg(data, colorspace="RGB"))
            w, h = im.size
            size = (256, int(256 * h / w)) if w <= h else (int(256 * w / h), 256)
            im = im.resize(size, Image.Resampling.BILINEAR)
            left, top = int(round((size[0] - 224) / 2)), int(round((size[1] - 224) / 2))
            im = im.crop((left, top, left + 224, top + 224))
            simplejpeg.encode_jpeg(np.asarray(im), quality=quality, colorspace="RGB", colorsubsampling="420")

    loops = {"random-resized-crop=224,hflip": rrc_hflip, "resize=256,center-crop=224": resize_center}
    if spec not in loops:
        raise SystemExit(f"no bare loop for {spec!r}; choose one of {', '.join(loops)}")
    return loops[spec]


def augmenter_loop(aug: Augmenter) -> Callable[[list[bytes]], None]:
    def run(images: list[bytes]) -> None:
        for i, data in enumerate(images):
            aug.apply(data, identity=identity(i), copy=0)

    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quality", type=int, default=90)
    ap.add_argument("--spec", action="append", help="default: both standard specs")
    args = ap.parse_args()
    specs = args.spec or ["random-resized-crop=224,hflip", "resize=256,center-crop=224"]

    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    images = make_jpegs(args.images)
    print(f"{len(images)} JPEGs {SIZE[0]}x{SIZE[1]}, {sum(map(len, images)) / len(images) / 1e3:.0f} kB mean; "
          f"CPU time of one process, medians of {args.rounds} rounds; simplejpeg {simplejpeg.__version__}, "
          f"Pillow {Image.__version__}")
    for spec in specs:
        plans = [Augmenter(ops=parse_augment(spec)).plan(*SIZE, identity=identity(i), copy=0)
                 for i in range(len(images))]
        runners = {
            "bare simplejpeg+Pillow loop": bare_loop(spec, args.quality, plans),
            "Augmenter engine=simplejpeg": augmenter_loop(Augmenter(ops=parse_augment(spec), quality=args.quality)),
            "Augmenter engine=pillow": augmenter_loop(
                Augmenter(ops=parse_augment(spec), quality=args.quality, engine="pillow")),
        }
        times: dict[str, list[float]] = {name: [] for name in runners}
        for run in runners.values():  # warm-up
            run(images[:20])
        for _ in range(args.rounds):
            for name, run in runners.items():
                t0 = time.process_time()  # CPU time of this process: per core, and blind to other load
                run(images)
                times[name].append(time.process_time() - t0)
        print(f"\n--augment {spec}")
        bare = statistics.median(times["bare simplejpeg+Pillow loop"])
        for name, ts in times.items():
            t = statistics.median(ts)
            print(f"  {name:30s} {len(images) / t:8.0f} images/s per core   {t / bare:5.2f}x the bare loop's time")
        ours = statistics.median(times["Augmenter engine=simplejpeg"])
        verdict(f"issue 3: --augment {spec} <= 1.2x the bare loop's time", ours <= 1.2 * bare,
                f"{ours / bare:.2f}x, {len(images) / ours:,.0f} images/s per core")
    print(f"\nload average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
