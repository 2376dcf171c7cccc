"""Synthetic files in the IceCube Kaggle layout, for tests and benchmarks of the long Parquet event layout.

``batch_{i}.parquet`` hold one row per pulse (``event_id``, ``sensor_id``, ``time``, ``charge``,
``auxiliary``), sorted by ``event_id``, in several row groups so events straddle them;
``train_meta.parquet`` holds one row per event (``batch_id``, ``event_id``, ``first_pulse_index``,
``last_pulse_index`` — rows of the event in its batch file, inclusive —, ``azimuth``, ``zenith``).
Pulse counts are heavy-tailed like the real ones; everything follows from the seed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def make_icecube_kaggle_like(folder: str | Path, *, batches: int, events_per_batch: int, mean_pulses: float,
                             seed: int = 0, row_group_rows: int | None = None) -> tuple[list[Path], Path]:
    """Write the batch files and the meta table into ``folder``: ``(batch paths, meta path)``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    paths: list[Path] = []
    metas: list[pa.Table] = []
    last_id = 0
    for b in range(1, batches + 1):
        n = events_per_batch
        ids = last_id + np.cumsum(rng.integers(1, 40, n, dtype=np.int64))  # increasing, with gaps, like Kaggle's
        last_id = int(ids[-1]) if n else last_id
        counts = np.maximum(1, rng.lognormal(np.log(mean_pulses) - 0.5, 1.0, n)).astype(np.int64)
        total = int(counts.sum())
        first = np.zeros(n, dtype=np.int64)
        np.cumsum(counts[:-1], out=first[1:])
        steps = rng.exponential(40.0, total).astype(np.int64) + 1
        clock = np.cumsum(steps)
        event_start = np.repeat(clock[first] - steps[first], counts)  # each event's clock restarts
        t0 = np.repeat(rng.integers(5000, 12000, n, dtype=np.int64), counts)
        pulses = pa.table({
            "event_id": np.repeat(ids, counts),
            "sensor_id": rng.integers(0, 5160, total, dtype=np.int16),
            "time": t0 + clock - event_start,
            "charge": np.round(rng.lognormal(0.0, 0.7, total) / 0.025) * 0.025,
            "auxiliary": rng.random(total) < 0.3,
        })
        path = folder / f"batch_{b}.parquet"
        rg = row_group_rows or max(1, min(1 << 20, total // 5))
        pq.write_table(pulses, path, row_group_size=rg)
        paths.append(path)
        metas.append(pa.table({
            "batch_id": np.full(n, b, dtype=np.int64),
            "event_id": ids,
            "first_pulse_index": first,
            "last_pulse_index": first + counts - 1,
            "azimuth": rng.uniform(0.0, 2 * np.pi, n),
            "zenith": np.arccos(rng.uniform(-1.0, 1.0, n)),
        }))
    meta_path = folder / "train_meta.parquet"
    pq.write_table(pa.concat_tables(metas), meta_path, row_group_size=max(1, events_per_batch))
    return paths, meta_path
