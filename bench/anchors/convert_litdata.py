"""LitData's ``optimize`` and ``StreamingDataset``, as a user scripts them, for the convert benchmark.

    python convert_litdata.py write FOLDER -o OUT [--workers 2]   # optimize(fn, inputs=paths, ...)
    python convert_litdata.py iterate OUT [--shuffle]              # StreamingDataset(OUT[, shuffle=True])

write: ``optimize`` with ``fn(path) -> {"jpg": raw bytes, "cls": label}`` over the image paths
(bench/anchors/convert_common.py order), ``num_workers`` workers, 256 MB chunks (as the other
writers), no compression; LitData reorders inputs by size across workers (its default) and does not
shuffle. iterate: ``StreamingDataset(OUT)`` (shuffle off, its default), or with ``--shuffle``
``StreamingDataset(OUT, shuffle=True)``, every field accessed, no decoding (the bytes serializer).
LitData's shuffle permutes the order of its chunks and the samples within each chunk it has loaded
(chunk-local): consecutive samples still come from one 256 MB chunk, so it reads as fast as in
order, but it is not a permutation of the whole dataset (issue 18, point 5). Runs from
bench/.venv-anchors. Prints one JSON line: seconds (after imports), samples, bytes.
"""

from __future__ import annotations

import os
import shutil

from convert_common import Clock, cli, drain, list_images

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


def iterate(out: str, shuffle: bool = False) -> None:
    from litdata import StreamingDataset

    clock = Clock()
    ds = StreamingDataset(out, shuffle=shuffle)
    drain(ds, clock, len=len(ds))


if __name__ == "__main__":
    cli(__doc__, write, iterate, workers=True, shuffle=True)
