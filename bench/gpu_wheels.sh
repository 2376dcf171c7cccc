#!/usr/bin/env bash
# The cp312 wheels that bench/bench_gpu_feed.py needs on the device machine and its image lacks
# (it has Python 3.12, torch, torchvision, Pillow, numpy, h5py, pyarrow, tokenizers, click, tqdm,
# and no network). Run here, with network, from the repository root; .whl/ is git-ignored, so
# hand it to the device run as a carried path (run(carry=[".whl"])). About 12 MB.
#
#   bash bench/gpu_wheels.sh [PYTHON]
#
# shardsmith's own dependencies (pyproject.toml) that the image lacks: orjson (every manifest),
# zstandard, gigatoken, rensa, jinja2 + markupsafe (imported by other commands only, but cheap);
# and simplejpeg (the [images] extra: bench/images.py encodes the benchmark's JPEGs with it).
# torchdata is not needed: the benchmark uses torch's DataLoader.
set -euo pipefail
PYTHON=${1:-python3}
rm -rf .whl && mkdir -p .whl
"$PYTHON" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl orjson zstandard "gigatoken>=0.10" "rensa>=0.5,<0.6" "jinja2>=3.1.6" markupsafe "simplejpeg>=1.7"
ls -la .whl && du -sh .whl
