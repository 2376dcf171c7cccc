#!/usr/bin/env bash
# Create bench/.venv-anchors: a venv of its own (never the project's .venv) with the anchor tools
# that bench/bench_pack_tokens.py compares pack-tokens against:
#   - datatrove (JsonlReader -> DocumentTokenizer -> DocumentTokenizerMerger; needs only `tokenizers`
#     beyond its core dependencies), run by anchors/datatrove_tokenize.py;
#   - megatron-core + transformers (+ torch, which megatron.core.datasets imports), for
#     anchors/megatron_preprocess.py: Megatron-LM's tools/preprocess_data.py is in no PyPI wheel, so
#     that script re-creates it on megatron-core's public API (see its docstring).
# Both run offline: tokenizers come from local tokenizer.json files, HF_HUB_OFFLINE=1.
#
# torch==2.13.0 is the CPU build that lies in /opt/wheels on these machines (pip's find-links); elsewhere
# pip would fetch a multi-GB CUDA build. `tokenizers` is pinned to the project venv's version, so that
# datatrove, Megatron, the bare HF script and `shardsmith pack-tokens --engine hf` encode with the same
# library and version. shardsmith's default engine does not: for byte-level BPE it picks gigatoken (after
# checking its ids against tokenizers' on a sample), so bench_pack_tokens.py shows both the end-to-end rows
# as a user runs each tool and a same-library table with --engine hf (issue 18, point 4).
#
# Usage: bash bench/anchors/setup.sh          (idempotent; about 1 GB on disk)
set -euo pipefail

bench="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$bench/.venv-anchors"
python="${PYTHON:-python3}"

tok_version="$("$bench/../.venv/bin/python" -c 'import tokenizers; print(tokenizers.__version__)' 2>/dev/null || echo 0.23.3)"

[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
"$venv/bin/pip" install --quiet \
    "torch==2.13.0" \
    "datatrove==0.10.1" \
    "megatron-core==0.16.1" \
    "transformers==5.23.0" \
    "tokenizers==$tok_version" \
    orjson \
    "litdata==0.2.76" \
    "Brotli>=1.0.9" "python-snappy>=0.6.1,<1" "zstd>=1.5.2.5,<2" "xxhash>=3,<4" "catalogue>=2,<3"
# mosaicml-streaming 0.13.0 pins transformers<5 and numpy<2.2 (against megatron's transformers 5 above): it goes in
# without its dependencies, whose ones that MDSWriter / StreamingDataset import are on the line above (its cloud
# SDKs are not needed for local files); bench/anchors/convert_mds.py says how it avoids torchvision.
"$venv/bin/pip" install --quiet --no-deps "mosaicml-streaming==0.13.0"

# Smoke test, offline: the imports the anchor scripts make.
HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONWARNINGS=ignore "$venv/bin/python" - <<'EOF'
from datatrove.executor import LocalPipelineExecutor
from datatrove.pipeline.readers import JsonlReader
from datatrove.pipeline.tokens import DocumentTokenizer, DocumentTokenizerMerger
from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
from megatron.core.tokenizers.text.utils.build_tokenizer import build_tokenizer
from importlib.metadata import version
print("anchors ready:", ", ".join(f"{p} {version(p)}" for p in ("datatrove", "megatron-core", "transformers", "tokenizers", "torch")))
EOF
