"""webdataset's own writer and reader, as a user scripts them, for the convert benchmark (issue 3).

    python convert_webdataset.py write FOLDER -o OUT      # ShardWriter, 256 MB shards
    python convert_webdataset.py iterate SHARD_DIR        # WebDataset over SHARD_DIR/*.tar, in order

write: one process, for each image (bench/anchors/convert_common.py order) ``{"__key__": stem,
"jpg": bytes, "cls": label}`` into ``ShardWriter(OUT/shard-%06d.tar, maxsize=256e6)``; no shuffle
(ShardWriter cannot shuffle beyond what the script does itself). iterate: ``WebDataset(tars,
shardshuffle=False)`` without decoding, every member accessed. Runs in the project venv (webdataset
is a shardsmith dependency). Prints one JSON line: seconds (after imports), samples, bytes.
"""

from __future__ import annotations

import glob
import os

from convert_common import Clock, cli, drain, list_images


def write(folder: str, out: str) -> None:
    import webdataset as wds

    clock = Clock()
    os.makedirs(out, exist_ok=True)
    n = size = 0
    with wds.ShardWriter(os.path.join(out, "shard-%06d.tar"), maxsize=256e6, verbose=0) as sink:
        for path, key, label in list_images(folder):
            with open(path, "rb") as f:
                data = f.read()
            sink.write({"__key__": key, "jpg": data, "cls": label})
            n += 1
            size += len(data)
    clock.report(samples=n, bytes=size)


def iterate(shard_dir: str) -> None:
    import webdataset as wds

    clock = Clock()
    urls = sorted(glob.glob(os.path.join(shard_dir, "*.tar")))
    drain(wds.WebDataset(urls, shardshuffle=False, empty_check=False), clock)


if __name__ == "__main__":
    cli(__doc__, write, iterate)
