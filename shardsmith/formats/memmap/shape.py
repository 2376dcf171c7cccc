"""What a memmap dataset holds, decided once from the event schema and the options: which ragged
fields become the F features of the ``N x L x F`` array, which fixed fields become N-row arrays,
the length L, the dtype and the truncation policy; and the names of a split's files.

The writer, the dataset reader and ``verify`` all take the layout from here, so the three agree.

The F features are the ragged fields of the one counter; several counters, no counter, or ragged
values with an inner shape are one-line usage errors, as are a missing ``--max-len``, a row over
256 MiB and ``--keep top:FIELD`` of a field outside the collection.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardsmith.core.events import EventSchema, Field
from shardsmith.errors import UsageError

DTYPES = {"float32": "<f4", "float16": "<f2"}
PAD_VALUE = 0.0  # what fills a row past an event's length (the lengths, not the pad, tell data from padding)
MAX_ROW_BYTES = 256 << 20  # one event's L x F row: beyond this, --max-len is a mistake, not a shape
FORMAT = "shardsmith-memmap"
FORMAT_VERSION = 1
_SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,63}")
_RESERVED = ("values", "lengths", "counts", "memmap")


@dataclass(frozen=True, kw_only=True)
class Keep:
    """The truncation policy of events longer than L: the ``first`` L values, the ``last`` L, or the
    ``top`` L by a field (the brightest: highest value first, NaN lowest, ties to the earlier value),
    kept in their input order."""

    how: str  # "first", "last" or "top"
    field: str | None = None

    @classmethod
    def parse(cls, spec: str) -> Keep:
        how, _, name = spec.partition(":")
        if how in ("first", "last") and not name:
            return cls(how=how)
        if how == "top" and name:
            return cls(how="top", field=name)
        raise UsageError(f"--keep {spec!r}: choose first, last or top:FIELD (the highest values of FIELD)")

    def __str__(self) -> str:
        return f"top:{self.field}" if self.how == "top" else self.how


@dataclass(frozen=True, kw_only=True)
class Layout:
    """The arrays of every split: ``features`` (ragged fields sharing ``counter``) padded to
    ``max_len`` in ``dtype``; ``scalars`` (the fixed fields) as N-row arrays of their own dtype;
    ``schema``: every field, as the event records hold them."""

    schema: EventSchema
    features: tuple[Field, ...]
    counter: str
    scalars: tuple[Field, ...]
    max_len: int
    dtype: np.dtype
    keep: Keep

    @property
    def row_bytes(self) -> int:
        return self.max_len * len(self.features) * self.dtype.itemsize

    def describe(self) -> dict[str, Any]:
        """The manifest's ``memmap`` entry."""
        return {"dtype": self.dtype.str, "max_len": self.max_len, "keep": str(self.keep), "pad_value": PAD_VALUE,
                "counter": self.counter, "fields": [f.name for f in self.features],
                "scalars": [f.name for f in self.scalars]}


def layout_of(schema: EventSchema, *, max_len: int | None, dtype: str, keep: str) -> Layout:
    """The layout for a run, or a one-line UsageError saying what cannot be laid out."""
    if max_len is None:
        raise UsageError("--to memmap needs --max-len L: every event is padded or truncated to L values")
    if dtype not in DTYPES:
        raise UsageError(f"--dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
    counters = schema.counters
    if not counters:
        raise UsageError("--to memmap pads a variable-length collection into N x L x F, and the inputs have none "
                         "(only one value per event); use --to hdf5")
    if len(counters) > 1:
        raise UsageError(f"--to memmap pads one collection per dataset; the inputs have {len(counters)} "
                         f"({', '.join(counters)}): choose one with --branches (--columns)")
    features = schema.members(counters[0])
    shaped = [f.name for f in features if f.shape]
    if shaped:
        raise UsageError(f"field {shaped[0]!r} holds arrays per value ({features[0].shape}); --to memmap takes "
                         f"one number per value: leave it out with --branches or use --to hdf5")
    np_dtype = np.dtype(DTYPES[dtype])
    rule = Keep.parse(keep)
    if rule.field is not None and rule.field not in {f.name for f in features}:
        raise UsageError(f"--keep {keep}: {rule.field!r} is not a field of the {counters[0]} collection "
                         f"({', '.join(f.name for f in features)})")
    layout = Layout(schema=schema, features=features, counter=counters[0], scalars=schema.fixed, max_len=max_len,
                    dtype=np_dtype, keep=rule)
    if layout.row_bytes > MAX_ROW_BYTES:
        raise UsageError(f"--max-len {max_len}: one event would take {layout.row_bytes:,} bytes "
                         f"({max_len} x {len(features)} fields x {np_dtype.itemsize}); at most {MAX_ROW_BYTES:,}")
    return layout


ARRAY_SUFFIX = ".bin"
META_SUFFIX = ".memmap.json"


def file_names(split: str, layout: Layout) -> dict[str, Any]:
    """The files of one split: ``values``, ``lengths``, ``counts``, ``meta`` and one per scalar field
    (named by the field when that makes a plain file name, else by its position)."""
    scalars = {}
    for k, f in enumerate(layout.scalars):
        safe = _SAFE_NAME.fullmatch(f.name) and f.name not in _RESERVED
        scalars[f.name] = f"{split}.{f.name}{ARRAY_SUFFIX}" if safe else f"{split}.scalar{k}{ARRAY_SUFFIX}"
    if len(set(scalars.values())) != len(scalars):  # "a" and a field named "scalar0": numbered, all of them
        scalars = {f.name: f"{split}.scalar{k}{ARRAY_SUFFIX}" for k, f in enumerate(layout.scalars)}
    return {**{k: f"{split}.{k}{ARRAY_SUFFIX}" for k in ("values", "lengths", "counts")},
            "meta": f"{split}{META_SUFFIX}", "scalars": scalars}
