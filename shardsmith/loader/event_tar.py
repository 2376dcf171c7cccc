"""Events in tar shards, read back as dicts of numpy arrays (``field`` instead of member ``field.npy``).

A thin layer over ``TarDataset``: the same random access, shuffled iteration, rank split and
resume; ``.npy`` members are loaded without pickles. With ``events_per_sample`` N a sample is a
window of N events, and ``{counter}.offsets`` cut its ragged fields into events.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from shardsmith.errors import DatasetError
from shardsmith.events import EventSchema
from shardsmith.loader.order import ResumableIterator
from shardsmith.loader.webdataset import TarDataset


class EventTarDataset:
    """One split of events in tar shards: ``len`` (samples), ``ds[i] -> {field: array}``, ``iter``."""

    def __init__(self, out_dir: str | os.PathLike[str], *, split: str = "train") -> None:
        self.tar = TarDataset(out_dir, split=split)
        events = self.tar.manifest.get("events")
        if not isinstance(events, dict):
            raise DatasetError(f"{out_dir}: the manifest describes no events")
        try:
            self.schema = EventSchema.from_json(self.tar.manifest["schema"])
            self.events_per_sample = int(events.get("events_per_sample", 1))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise DatasetError(f"{out_dir}: the manifest's event schema is malformed ({exc})") from None
        self._members = {f"{f.name}.npy": f.name for f in self.schema.fields}
        if self.events_per_sample > 1:
            self._members.update({f"{c}.offsets.npy": f"{c}.offsets" for c in self.schema.counters})

    def __len__(self) -> int:
        return len(self.tar)

    def __getitem__(self, i: int) -> dict[str, Any]:
        raw = self.tar[i]
        out: dict[str, Any] = {"__key__": raw["__key__"]}
        for member, name in self._members.items():
            value = raw.get(member)
            if not isinstance(value, np.ndarray):
                raise DatasetError(f"{self.tar.out_dir}: sample {raw['__key__']} has no array member {member}")
            out[name] = value
        return out

    def get_batch(self, indices: Any) -> list[dict[str, Any]]:
        return [self[int(i)] for i in np.asarray(indices).reshape(-1)]

    def __getitems__(self, indices: list[int]) -> list[dict[str, Any]]:
        return self.get_batch(indices)

    def iter(self, *, shuffle: bool = True, seed: int = 0, epoch: int = 0, rank: int = 0, world_size: int = 1,
             batch_size: int | None = None, drop_last: bool = False) -> ResumableIterator[Any]:
        """Samples in this rank's slice of the epoch's exact permutation (ranks drop the remainder)."""
        return ResumableIterator(n=len(self), get_item=self.__getitem__, get_batch=self.get_batch, shuffle=shuffle,
                                 seed=seed, epoch=epoch, rank=rank, world_size=world_size, batch_size=batch_size,
                                 drop_last=drop_last)
