"""datatrove's MinHash dedup, its four stages as its README runs them, for bench/bench_dedup.py.

    /work/bench-venvs/datatrove/bin/python bench/dedup_datatrove.py CORPUS_DIR WORK \
        --ngram 5 --bands 9 --rows 13 --tasks 2 [--seed 1]

Runs in datatrove's own venv (``pip install datatrove spacy``: its English word tokenizer is spaCy's
blank pipeline). Stages, each a ``LocalPipelineExecutor`` with ``--tasks`` tasks on as many workers
(the bucket stage has one task per band, as datatrove's example has it):
  1. JsonlReader(CORPUS_DIR) -> MinhashDedupSignature        WORK/signatures
  2. MinhashDedupBuckets                                      WORK/buckets
  3. MinhashDedupCluster (one task)                           WORK/remove_ids
  4. JsonlReader(CORPUS_DIR) -> MinhashDedupFilter(exclusion_writer=JsonlWriter(WORK/removed))
     -> JsonlWriter(WORK/deduplicated)                        the kept documents, as users write them
Prints one JSON line: seconds per stage, and the removed documents as [file, line] (the reader's
document id is "<file>/<line>").
"""

from __future__ import annotations

import argparse
import glob
import gzip
import json
import os
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("corpus")
    ap.add_argument("work")
    ap.add_argument("--ngram", type=int, default=5)
    ap.add_argument("--bands", type=int, default=9)
    ap.add_argument("--rows", type=int, default=13)
    ap.add_argument("--tasks", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()

    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.dedup.minhash import (
        MinhashConfig,
        MinhashDedupBuckets,
        MinhashDedupCluster,
        MinhashDedupFilter,
        MinhashDedupSignature,
    )
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.writers.jsonl import JsonlWriter

    config = MinhashConfig(n_grams=args.ngram, num_buckets=args.bands, hashes_per_bucket=args.rows, seed=args.seed)
    w = args.work
    times = {}

    def stage(name: str, pipeline: list, tasks: int) -> None:
        t0 = time.perf_counter()
        LocalPipelineExecutor(pipeline=pipeline, tasks=tasks, workers=min(tasks, args.tasks),
                              logging_dir=f"{w}/logs/{name}").run()
        times[name] = time.perf_counter() - t0

    stage("signatures", [JsonlReader(args.corpus), MinhashDedupSignature(output_folder=f"{w}/signatures",
                                                                        config=config)], args.tasks)
    stage("buckets", [MinhashDedupBuckets(input_folder=f"{w}/signatures", output_folder=f"{w}/buckets",
                                          config=config)], config.num_buckets)
    stage("cluster", [MinhashDedupCluster(input_folder=f"{w}/buckets", output_folder=f"{w}/remove_ids",
                                          config=config)], 1)
    stage("filter", [JsonlReader(args.corpus),
                     MinhashDedupFilter(input_folder=f"{w}/remove_ids",
                                        exclusion_writer=JsonlWriter(f"{w}/removed")),
                     JsonlWriter(f"{w}/deduplicated")], args.tasks)

    removed = []
    for path in sorted(glob.glob(f"{w}/removed/*")):
        with (gzip.open if path.endswith(".gz") else open)(path, "rt") as f:
            for line in f:
                doc_id = json.loads(line)["id"]
                name, _, idx = doc_id.rpartition("/")
                removed.append([os.path.basename(name), int(idx)])
    import datatrove

    print(json.dumps({"version": datatrove.__version__ if hasattr(datatrove, "__version__") else _version(),
                      "seconds": times, "removed": sorted(removed)}))


def _version() -> str:
    from importlib.metadata import version

    return version("datatrove")


if __name__ == "__main__":
    main()
