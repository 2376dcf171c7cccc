"""What every writer shares: shard naming, rollover bookkeeping, and the record of finished shards."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np


@dataclass(slots=True)
class ShardRecord:
    """A finished shard as the manifest lists it."""

    path: str
    samples: int
    bytes: int
    sha256: str
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "samples": self.samples, "bytes": self.bytes, "sha256": self.sha256,
                **self.extra}


class Writer:
    """Base class: receives one split's samples in output order and cuts them into shards.

    A subclass writes ``_open_shard``, ``_write`` and ``_close_shard``; rollover and naming live
    here so every format rolls over the same way.
    """

    name: ClassVar[str] = ""
    suffix: ClassVar[str] = ""

    def __init__(self, *, out_dir: Path, split: str) -> None:
        self.out_dir = Path(out_dir)
        self.split = split
        self.shards: list[ShardRecord] = []
        self._open = False

    def shard_name(self, index: int, suffix: str | None = None) -> str:
        return f"{self.split}-{index:06d}{self.suffix if suffix is None else suffix}"

    def write_batch(self, lengths: np.ndarray, payload: memoryview) -> None:
        raise NotImplementedError

    def close(self) -> list[ShardRecord]:
        raise NotImplementedError
