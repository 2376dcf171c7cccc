"""datatrove's tokenize-and-merge path, as its examples chain it, for the pack-tokens benchmark.

    python datatrove_tokenize.py INPUT_DIR -o WORKDIR --tokenizer bpe.json --tasks 2

Stage 1 (``tasks`` tasks on ``tasks`` workers): ``JsonlReader(INPUT_DIR)`` -> ``DocumentTokenizer``
(tokenizer from a local tokenizer.json, eos appended, documents shuffled within each task's file).
Stage 2 (one task, it cannot be split): ``DocumentTokenizerMerger`` shuffles and merges the tasks'
files into WORKDIR/merged. datatrove gives each task whole input files, so INPUT_DIR should
hold at least ``tasks`` JSONL files (the benchmark splits its corpus); a single file would keep
one core idle. Runs offline (HF_HUB_OFFLINE=1: a local tokenizer file is never fetched).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from datatrove.executor import LocalPipelineExecutor  # noqa: E402
from datatrove.pipeline.readers import JsonlReader  # noqa: E402
from datatrove.pipeline.tokens import DocumentTokenizer, DocumentTokenizerMerger  # noqa: E402


def run(input_dir: str, workdir: str, tokenizer: str, tasks: int, eos_token: str = "<|endoftext|>") -> float:
    """Run both stages from scratch in `workdir`; return the wall time in seconds."""
    work = Path(workdir)
    shutil.rmtree(work, ignore_errors=True)  # datatrove skips tasks it finds completed in its logs
    t0 = time.perf_counter()
    tokenize = LocalPipelineExecutor(
        pipeline=[
            JsonlReader(input_dir, glob_pattern="*.jsonl", add_file_path=False),
            DocumentTokenizer(output_folder=str(work / "tokenized"), tokenizer_name_or_path=tokenizer,
                              eos_token=eos_token, local_working_dir=str(work / "scratch"), seed=0),
        ],
        tasks=tasks, workers=tasks, logging_dir=str(work / "logs-tokenize"),
    )
    merge = LocalPipelineExecutor(
        pipeline=[DocumentTokenizerMerger(input_folder=str(work / "tokenized"), output_folder=str(work / "merged"),
                                          save_filename="merged", seed=0, progress=False)],
        tasks=1, logging_dir=str(work / "logs-merge"), depends=tokenize,
    )
    merge.run()
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("input_dir", help="a folder of .jsonl files")
    ap.add_argument("-o", "--workdir", required=True, help="emptied first; output in WORKDIR/merged")
    ap.add_argument("--tokenizer", required=True, help="a local tokenizer.json")
    ap.add_argument("--eos-token", default="<|endoftext|>")
    ap.add_argument("--tasks", type=int, default=2)
    args = ap.parse_args(argv)
    dt = run(args.input_dir, args.workdir, args.tokenizer, args.tasks, args.eos_token)
    print(f"datatrove_tokenize: {dt:.2f} s -> {args.workdir}/merged", file=sys.stderr)


if __name__ == "__main__":
    main()
