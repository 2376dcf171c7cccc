"""The loader pipeline's skip policy (issue 44, item 3): what a sample that cannot be read costs.

``on_error="raise"`` (the default): one line naming the shard, the sample's key and why.
``on_error="skip"``: the sample is replaced, counted and recorded, up to ``max_skipped`` (a count,
or a fraction of the samples this stream reads in the epoch, rounded up); one more is that one-line
error.

**Exactness.** The replacement of sample i in epoch e is the first readable sample of a substitute
sequence that depends only on (seed, epoch, i) (``substitutes``: splitmix64 of a keyed hash, not the
rank, the worker, nor what was read before). Whether a sample reads is a property of the files, so
a run resumed from any state, with any number of workers, or from a ``global_position`` on another
world size, puts the same substitute at the same place as the uninterrupted run: the batches are the
same, skips included, without any stream knowing another's skips. The state records each stream's
skips (``skipped``: epoch, index, shard, key, reason, substitute) so that the count and ``report()``
go on where they were; nothing about the batches is read back from it.

**What counts as unreadable**: a ``DatasetError`` raised while reading the sample (a member that does
not decode, a truncated HDF5 chunk, a shard changed, truncated or of another size than the manifest
says, read lazily), and with ``verify="sample"`` a sample whose bytes differ from the hash its
writer recorded for it (``Dataset.verify_samples``; no built-in format records one: their manifests
hash whole files, which ``shardsmith verify`` checks). Anything else (a bug, a user's collate) raises.

**Cost when nothing is skipped**: a ``try`` around each read (free in CPython 3.11+); the probes,
the substitutes and the limit are computed only once a read has failed.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardsmith.errors import DatasetError
from shardsmith.kit.keys import GOLDEN, mix64, path_hash

ON_ERROR = ("raise", "skip")
VERIFY = (None, "sample")
TRIES = 64  # substitutes tried for one skipped sample before the run stops (a dataset mostly unreadable)
MAX_ENTRIES = 1 << 20  # skip records a loaded state may hold (each a small dict)
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
ENTRY = {"epoch": int, "index": int, "substitute": int, "shard": str, "key": str, "reason": str}


@dataclass(frozen=True)
class SkipPolicy:
    """``on_error``, ``max_skipped`` and ``verify`` as the pipeline takes them (checked here, once)."""

    on_error: str = "raise"
    max_skipped: int | float = 0.01
    verify: str | None = None

    def __post_init__(self) -> None:
        if self.on_error not in ON_ERROR:
            raise ValueError(f"on_error={self.on_error!r}: choose 'raise' or 'skip'")
        if self.verify not in VERIFY:
            raise ValueError(f"verify={self.verify!r}: choose None or 'sample'")
        limit = self.max_skipped
        if isinstance(limit, bool) or not isinstance(limit, int | float | np.integer | np.floating):
            raise ValueError(f"max_skipped={limit!r}: give a count (an int) or a fraction (a float in [0, 1))")
        if isinstance(limit, int | np.integer) and limit < 0:
            raise ValueError(f"max_skipped={limit}: a count of samples is at least 0")
        if isinstance(limit, float | np.floating) and not 0 <= limit < 1:
            raise ValueError(f"max_skipped={limit}: a fraction is in [0, 1) (a count is an int)")

    def limit(self, share: int) -> int:
        """The skips allowed in a stream that reads ``share`` samples of the epoch: a count as it is, a
        fraction of the share rounded up (so a small stream's first bad sample is not already too many)."""
        if isinstance(self.max_skipped, int | np.integer):
            return operator.index(self.max_skipped)
        return math.ceil(float(self.max_skipped) * share)

    def shown(self) -> str:
        return f"max_skipped={self.max_skipped!r}"


def substitutes(n: int, *, seed: int, epoch: int, index: int) -> list[int]:
    """The samples that may stand in for sample ``index`` of an ``n``-sample epoch, in the order they
    are tried: a pure function of (seed, epoch, index), the same in every rank, worker and resume."""
    base = path_hash("substitute", f"{seed}:{epoch}:{index}")
    with np.errstate(over="ignore"):
        draws = mix64(base + np.arange(1, TRIES + 1, dtype=np.uint64) * GOLDEN)
    return (draws % np.uint64(max(n, 1))).astype(np.int64).tolist()


def origin(dataset: Any, index: int) -> tuple[str, str]:
    """(shard, key) of sample ``index``, as the dataset names them; never raises (it names a sample
    that could not be read: a shard that cannot be opened may still be named)."""
    try:
        shard, key = dataset.origin(index)
        return str(shard), str(key)
    except Exception:  # noqa: BLE001  (only a name for a message: the read's own error is what matters)
        return str(getattr(dataset, "out_dir", type(dataset).__name__)), f"sample {index}"


def reason_of(error: BaseException, shard: str) -> str:
    """The error's message without the shard it starts with (the line names the shard once)."""
    text = _ADDRESS.sub("", str(error).replace("\n", " "))  # no memory address: a record is the same every run
    for prefix in (f"{shard}: ", f"{shard} "):
        if text.startswith(prefix):
            return text[len(prefix):]
    return text


def fault(shard: str, key: str, reason: str, *, after: str = "") -> DatasetError:
    """The one-line error of a sample that cannot be read."""
    return DatasetError(f"{shard}: sample {key}: {reason}{after}")


def check_entries(value: Any) -> list[dict[str, Any]]:
    """A state's ``skipped`` list, each record checked (types, bounds) before anything uses it."""
    if not isinstance(value, list):
        raise ValueError(f"state_dict 'skipped' {value!r:.80} is not a list")
    if len(value) > MAX_ENTRIES:
        raise ValueError(f"state_dict 'skipped' lists {len(value)} samples: more than a loader records")
    out = []
    for entry in value:
        if not isinstance(entry, Mapping) or set(entry) != set(ENTRY):
            raise ValueError(f"state_dict 'skipped' holds {entry!r:.80}, not a record of "
                             f"{', '.join(sorted(ENTRY))}")
        for key, kind in ENTRY.items():
            if type(entry[key]) is not kind or (kind is int and not 0 <= entry[key] < 1 << 62):
                raise ValueError(f"state_dict 'skipped' record field {key!r} {entry[key]!r:.60} is not a "
                                 f"{'whole number' if kind is int else 'string'}")
        out.append(dict(entry))
    return out


@dataclass(frozen=True)
class SkipReport:
    """What a loader skipped: one (shard, key, reason) per replaced sample, with its epoch, index
    and the sample that stood in for it (``as_dict``: JSON-able)."""

    skipped: tuple[dict[str, Any], ...]

    def __len__(self) -> int:
        return len(self.skipped)

    def as_dict(self) -> dict[str, Any]:
        return {"skipped": len(self.skipped), "samples": [dict(e) for e in self.skipped]}

    def lines(self) -> list[str]:
        """One line per skipped sample, as a log shows them."""
        return [f"{e['shard']}: sample {e['key']} (epoch {e['epoch']}, index {e['index']}, replaced by "
                f"{e['substitute']}): {e['reason']}" for e in self.skipped]
