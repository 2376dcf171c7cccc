"""LitData's ``optimize`` and ``StreamingDataset``, as a user scripts them, for the convert benchmark.

    python convert_litdata.py write FOLDER -o OUT [--workers 2]   # optimize(fn, inputs=paths, ...)
    python convert_litdata.py iterate OUT                          # StreamingDataset(OUT), in order

write: ``optimize`` with ``fn(path) -> {"jpg": raw bytes, "cls": label}`` over the image paths
(bench/anchors/convert_common.py order), ``num_workers`` workers, 256 MB chunks (as the other
writers), no compression; LitData reorders inputs by size across workers (its default) and does not
shuffle. iterate: ``StreamingDataset(OUT)`` (shuffle off, its default), every field accessed, no
decoding (the bytes serializer). Runs from bench/.venv-anchors. Prints one JSON line: seconds
(after imports), samples, bytes.
"""

from __future__ import annotations

import argparse
import os
import shutil

from convert_common import Clock, list_images, touch

LABELS: dict[str, int] = {}


def load(path: str) -> dict:
    with open(path, "rb") as f:
        return {"jpg": f.read(), "cls": LABELS[os.path.basename(os.path.dirname(path))]}


def write(folder: str, out: str, workers: int) -> None:
    from litdata import optimize

    clock = Clock()
    shutil.rmtree(out, ignore_errors=True)
    images = list_images(folder)
    for path, _key, label in images:
        LABELS[os.path.basename(os.path.dirname(path))] = label
    optimize(fn=load, inputs=[p for p, _, _ in images], output_dir=out, num_workers=workers,
             chunk_bytes="256MB", mode="overwrite", verbose=False, start_method="fork")
    size = sum(os.path.getsize(p) for p, _, _ in images)
    clock.report(samples=len(images), bytes=size)


def iterate(out: str) -> None:
    from litdata import StreamingDataset

    clock = Clock()
    ds = StreamingDataset(out)
    n = size = 0
    for sample in ds:
        n += 1
        size += touch(sample)
    clock.report(samples=n, bytes=size, len=len(ds))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("action", choices=["write", "iterate"])
    ap.add_argument("path")
    ap.add_argument("-o", "--out")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    write(args.path, args.out, args.workers) if args.action == "write" else iterate(args.path)


if __name__ == "__main__":
    main()
