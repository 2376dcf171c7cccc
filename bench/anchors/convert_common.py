"""Shared by the convert anchors (bench/anchors/convert_*.py): the image folder's samples, in one order.

Every anchor writes the same samples in the same order: classes sorted by name (label = position,
the torchvision convention), files sorted by name within a class; the key is the file's stem.
No shardsmith import: the anchors run from bench/.venv-anchors.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Iterable

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp")
PAGE = 4096  # touch reads one byte a page


def list_images(folder: str) -> list[tuple[str, str, int]]:
    """``(path, key, label)`` of every image, in class order then file-name order."""
    classes = sorted(e.name for e in os.scandir(folder) if e.is_dir() and not e.name.startswith("."))
    out = []
    for label, name in enumerate(classes):
        d = os.path.join(folder, name)
        for f in sorted(os.listdir(d)):
            if f.lower().endswith(IMAGE_SUFFIXES) and not f.startswith("."):
                out.append((os.path.join(d, f), os.path.splitext(f)[0], label))
    return out


def touch(sample: dict) -> int:
    """Bytes in a sample's bytes-like fields, reading one byte of every 4 KB page of each: a loader
    that hands out views into its map (LitData's ``memoryview``s) then reads them from the page
    cache, as one that copies (shardsmith, webdataset) already has; a view never read cost nothing
    (issue 18: LitData's iteration was timed without reading its samples' bytes)."""
    size = 0
    for v in sample.values():
        if isinstance(v, bytes | bytearray | memoryview):
            size += len(v)
            bytes(memoryview(v).cast("B")[::PAGE])
    return size


class Clock:
    """Seconds since construction; ``report`` prints one JSON line for the benchmark to parse."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()

    def report(self, **fields: object) -> None:
        print(json.dumps({"seconds": time.perf_counter() - self.t0, **fields}))
        sys.stdout.flush()


def drain(samples: Iterable[dict], clock: Clock, **fields: object) -> None:
    """Iterate to the end, touching every sample's bytes, and report the time since ``clock`` started."""
    n = size = 0
    for sample in samples:
        n += 1
        size += touch(sample)
    clock.report(samples=n, bytes=size, **fields)


def cli(doc: str | None, write: Callable[..., None], iterate: Callable[..., None], *, workers: bool = False,
        shuffle: bool = False) -> None:
    """``ANCHOR write FOLDER -o OUT [--workers N]`` or ``ANCHOR iterate OUT [--shuffle]``."""
    ap = argparse.ArgumentParser(description=(doc or "").splitlines()[0])
    ap.add_argument("action", choices=["write", "iterate"])
    ap.add_argument("path")
    ap.add_argument("-o", "--out")
    if workers:
        ap.add_argument("--workers", type=int, default=2)
    if shuffle:
        ap.add_argument("--shuffle", action="store_true", help="iterate with the tool's own shuffle")
    args = ap.parse_args()
    if args.action == "iterate":
        iterate(args.path, **({"shuffle": args.shuffle} if shuffle else {}))
    elif workers:
        write(args.path, args.out, args.workers)
    else:
        write(args.path, args.out)
