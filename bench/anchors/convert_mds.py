"""MosaicML Streaming's MDSWriter and StreamingDataset, as a user scripts them, for the convert benchmark.

    python convert_mds.py write FOLDER -o OUT      # MDSWriter(columns {"jpg": "bytes", "cls": "int"})
    python convert_mds.py iterate OUT              # StreamingDataset(local=OUT), in order, no decoding

write: one process, every image (bench/anchors/convert_common.py order) as ``{"jpg": bytes, "cls":
label}``, shards of 256 MB (``size_limit``, as the other writers), no compression, no hashes;
MDSWriter does not shuffle. iterate: ``StreamingDataset(local=OUT, shuffle=False, batch_size=256)``,
every sample's fields accessed; stale shared memory from an earlier run is cleaned first.

Why batch_size=256: it is the batch of the standard ImageNet ResNet-50 recipe, as a one-device loop
sets it (StreamingDataset's batch_size is the per-device batch its DataLoader uses). StreamingDataset sizes its
look-ahead from it: with batch_size=1 only 8 samples are prepared ahead and its ready thread sleeps
7 ms whenever it is ahead, about 0.83 ms a sample (16.6 s for 20,000 images where batch_size=256
takes 1.5-2.0 s), which measured its sleep, not its reading (issue 18, point 1).

Runs from bench/.venv-anchors. mosaicml-streaming 0.13 pins transformers<5 and numpy<2.2 while the
venv holds megatron's transformers 5, so it is installed with --no-deps plus the dependencies its
writer and dataset import (see setup.sh); its package ``__init__`` eagerly imports
``streaming.vision`` and so torchvision, whose PyPI build is CUDA-linked and cannot load against the
CPU torch of these machines. MDSWriter and StreamingDataset live in ``streaming.base`` and need
neither: the package is entered without running its ``__init__`` (``_import_streaming_base``).
Prints one JSON line: seconds (after imports), samples, bytes.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
import types

from convert_common import Clock, cli, drain, list_images

BATCH_SIZE = 256  # a training loop's per-device batch (see the docstring)


def _import_streaming_base():
    spec = importlib.util.find_spec("streaming")
    if spec is None:
        raise SystemExit("mosaicml-streaming is not installed: bash bench/anchors/setup.sh")
    pkg = types.ModuleType("streaming")
    pkg.__path__ = list(spec.submodule_search_locations)
    sys.modules.setdefault("streaming", pkg)
    import streaming.base as base

    return base


def write(folder: str, out: str) -> None:
    base = _import_streaming_base()
    clock = Clock()
    shutil.rmtree(out, ignore_errors=True)
    n = size = 0
    with base.MDSWriter(out=out, columns={"jpg": "bytes", "cls": "int"}, size_limit=256_000_000) as sink:
        for path, _key, label in list_images(folder):
            with open(path, "rb") as f:
                data = f.read()
            sink.write({"jpg": data, "cls": label})
            n += 1
            size += len(data)
    clock.report(samples=n, bytes=size)


def iterate(out: str) -> None:
    base = _import_streaming_base()
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    clock = Clock()
    ds = base.StreamingDataset(local=out, shuffle=False, batch_size=BATCH_SIZE)
    drain(ds, clock, len=len(ds))


if __name__ == "__main__":
    cli(__doc__, write, iterate)
