"""What a dataset's samples are (``SampleKind``) and the shape its batches take (``BatchForm``).

Every loader dataset names its kind (``kit/dataset.py``): a name (``"token windows"``), the traits
two datasets must share for their samples to go in one batch (the window length, the tokenizer,
an event schema...), and the form of its batches. The form is what the loader needs to know of a
batch without knowing the format: how to take one sample out of it (``item``) and how to make one
batch out of several datasets' batches (``join``, ``gather``: a mixture's). Four forms cover the
built-in formats: a list of samples, a tuple of arrays and a dict of arrays (both with a leading
batch axis: ``arrays``, which the torch adapters turn into tensors), and an ``EventBatch``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from shardsmith.kit.event_batch import EventBatch

# (rows of the joined batch, that dataset's batch of them), one per dataset a batch draws from
Parts = Sequence[tuple[np.ndarray, Any]]
# (a dataset, the sample indices read from it, the rows of the joined batch they go to)
Groups = Sequence[tuple[Any, np.ndarray, np.ndarray]]


class BatchForm:
    """How batches of one kind are cut into samples and joined (see the module)."""

    name: ClassVar[str] = ""
    arrays: ClassVar[bool] = False  # every leaf an array with a leading batch axis (torch takes them as tensors)

    def item(self, batch: Any, k: int) -> Any:
        """Sample k of ``batch``."""
        raise NotImplementedError

    def join(self, parts: Parts, n: int) -> Any:
        """One batch of ``n`` samples from several datasets' batches, each sample in its row."""
        raise NotImplementedError

    def gather(self, groups: Groups, n: int) -> Any:
        """One batch of ``n`` samples read from several datasets (``read`` of each, then ``join``);
        a form whose datasets can read straight into one batch overrides it."""
        parts = [(rows, ds.read(indices)) for ds, indices, rows in groups]
        return parts[0][1] if len(parts) == 1 else self.join(parts, n)

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other)

    def __hash__(self) -> int:
        return hash(type(self))


class ListForm(BatchForm):
    """A batch is a list of samples (tar samples, documents, packed sequences)."""

    name = "list"

    def item(self, batch: list[Any], k: int) -> Any:
        return batch[k]

    def join(self, parts: Parts, n: int) -> list[Any]:
        out: list[Any] = [None] * n
        for rows, batch in parts:
            for r, sample in zip(rows.tolist(), batch):
                out[r] = sample
        return out


class ArraysForm(BatchForm):
    """A batch is a tuple of arrays, each (B, ...) (token windows' ``(x, y)``)."""

    name = "arrays"
    arrays = True

    def item(self, batch: tuple[np.ndarray, ...], k: int) -> tuple[np.ndarray, ...]:
        return tuple(field[k] for field in batch)

    def join(self, parts: Parts, n: int) -> tuple[np.ndarray, ...]:
        first = parts[0][1]
        out = tuple(np.empty((n, *field.shape[1:]), dtype=field.dtype) for field in first)
        for rows, batch in parts:  # one copy: each dataset's rows straight into place
            for field, values in zip(out, batch):
                field[rows] = values
        return out


class MappingForm(BatchForm):
    """A batch is a dict of arrays (or of dicts of them), each (B, ...) (memmap events)."""

    name = "mapping"
    arrays = True

    def item(self, batch: Mapping[str, Any], k: int) -> dict[str, Any]:
        return {key: self.item(value, k) if isinstance(value, Mapping) else value[k] for key, value in batch.items()}

    def join(self, parts: Parts, n: int) -> dict[str, Any]:
        return _joined([batch for _, batch in parts], [rows for rows, _ in parts], n)


def _joined(batches: list[Mapping[str, Any]], rows: list[np.ndarray], n: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in batches[0].items():
        if isinstance(value, Mapping):
            out[key] = _joined([b[key] for b in batches], rows, n)
            continue
        field = out[key] = np.empty((n, *value.shape[1:]), dtype=value.dtype)
        for r, b in zip(rows, batches):
            field[r] = b[key]
    return out


class EventForm(BatchForm):
    """A batch is an ``EventBatch`` (columns of fixed and ragged fields: hdf5 events)."""

    name = "events"

    def item(self, batch: EventBatch, k: int) -> dict[str, np.ndarray]:
        return batch.event(k)

    def join(self, parts: Parts, n: int) -> EventBatch:
        first = parts[0][1]
        events: list[Any] = [None] * n
        for rows, batch in parts:
            for r, k in zip(rows.tolist(), range(len(batch))):
                events[r] = batch.event(k)
        return EventBatch.from_samples(events, first.schema)


@dataclass(frozen=True)
class SampleKind:
    """What a dataset's samples are: ``name`` (as messages say it), the ``form`` of its batches, and
    ``traits``: (name, value) pairs two datasets must share for their samples to share a batch (a
    mixture's sources: the same kind, traits and all). Values are plain (str, int, None, tuples)."""

    name: str
    form: BatchForm
    traits: tuple[tuple[str, Any], ...] = ()

    def difference(self, other: SampleKind) -> str | None:
        """Why samples of ``other`` cannot share a batch with this kind's (None: they can)."""
        if other.name != self.name or other.form != self.form:
            return f"{other.name} against {self.name}"
        mine, theirs = dict(self.traits), dict(other.traits)
        for key in dict.fromkeys([*mine, *theirs]):
            if mine.get(key) != theirs.get(key):
                return f"{self.name} of {key} {_shown(theirs.get(key))} against {_shown(mine.get(key))}"
        return None


def _shown(value: Any) -> str:
    text = str(value)
    return text if len(text) <= 40 else text[:37] + "..."
