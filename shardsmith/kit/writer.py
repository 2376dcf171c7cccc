"""What every writer shares: shard naming, rollover bookkeeping, and the record of finished shards.

A writer records what it made as a *piece* (``Writer.piece``), which the gather keeps in the scratch
folder; a rerun trusts a piece only while every file it vouches for is as it was written
(``engine/shuffle/pieces.py``). What a piece vouches for is said here, in words every writer shares, not by
any format's file names: its shards' files and their companions (``core.manifest.shard_files``), the
``files`` it names beside them (a split-wide file one writer wrote whole) and the ``stretches`` of a
split-wide file several writers fill at once (each ``{"scratch", "path", "end"}``: the file in the
scratch folder while the split is unfinished, or the output file it is then moved to, reaches ``end``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from shardsmith.core.manifest import shard_files
from shardsmith.kit.rollover import Rollover

if TYPE_CHECKING:
    from shardsmith.kit.batches import MappedBatch, SortedBatch


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

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ShardRecord:
        rest = {k: v for k, v in d.items() if k not in ("path", "samples", "bytes", "sha256")}
        return cls(path=d["path"], samples=int(d["samples"]), bytes=int(d["bytes"]), sha256=d["sha256"], extra=rest)


Replaced = Callable[[str, int, ShardRecord], None]  # ``Writer.join_shards``'s word of a rewritten shard

# the names ``Writer.shard_name`` gives, as a pattern (``core/own_files.py``): what a format that
# declares no files of its own owns (``Format.own_files``)
SHARD_NAMES = "*-" + "[0-9]" * 6 + ".*"


def piece_files(piece: dict[str, Any]) -> list[dict[str, Any]]:
    """The files a piece vouches for, each ``{"path", "bytes", ...}`` relative to the output: its
    shards' and their companions', then the ``files`` it names."""
    return [*(e for shard in piece.get("shards") or () for e in shard_files(shard)), *(piece.get("files") or ())]


def piece_stretches(piece: dict[str, Any]) -> list[dict[str, Any]]:
    """The stretches of split-wide files a piece vouches for (``{"scratch", "path", "end"}`` each)."""
    return list(piece.get("stretches") or ())


@dataclass(frozen=True, kw_only=True)
class ShardRange:
    """Which shards of a split one writer makes: from ``first_shard`` on, after ``weight_before``
    (in the writer's rollover units) of the split; ``whole``: the writer makes every shard."""

    first_shard: int = 0
    first_sample: int = 0  # the split's samples before this range
    weight_before: int = 0
    whole: bool = True
    work_dir: Path | None = None  # scratch shared by the writers of one split (a flat file written in pieces)


class Writer:
    """Base class: receives one split's samples in output order and cuts them into shards.

    A subclass writes ``_open_shard``, ``_write`` and ``_close_shard``; rollover and naming live
    here so every format rolls over the same way.
    """

    name: ClassVar[str] = ""
    suffix: ClassVar[str] = ""

    def __init__(self, *, out_dir: Path, split: str, part: ShardRange | None = None) -> None:
        self.out_dir = Path(out_dir)
        self.split = split
        self.part = part or ShardRange()
        self.shards: list[ShardRecord] = []
        self.md5s: list[str | None] = []

    def shard_name(self, index: int, suffix: str | None = None) -> str:
        return f"{self.split}-{index:06d}{self.suffix if suffix is None else suffix}"

    @property
    def weigh_payload(self) -> bool:
        """Whether ``weights`` reads the payload, not only the lengths (the gather's plan then reads it too)."""
        return False

    @property
    def rangeable(self) -> bool:
        """Whether several writers may each make a range of one split's shards."""
        return True

    def next_index(self) -> int:
        """The split-wide number of the next shard this writer starts."""
        return self.part.first_shard + len(self.shards)

    def rollover(self) -> Rollover:
        """A fresh rollover rule with this writer's limits."""
        raise NotImplementedError

    def weights(self, lengths: np.ndarray, payload: memoryview | None) -> np.ndarray:
        """Each sample's weight in the rollover's units (``payload`` only if ``weigh_payload``)."""
        return np.asarray(lengths, dtype=np.int64)

    def total_weight(self, payload_bytes: int) -> int | None:
        """The summed ``weights`` of samples whose payloads total ``payload_bytes``, when that sum
        follows from it alone (weights that are the lengths); None when it does not (a subclass
        with its own ``weights``)."""
        return payload_bytes if type(self).weights is Writer.weights else None

    def sorted_weights(self, batch: SortedBatch) -> np.ndarray:
        """``weights`` of a gathered batch (a writer that reads records in place skips the sorted copy)."""
        return self.weights(batch.lengths, batch.payload)

    def piece(self) -> dict[str, Any]:
        """What this writer made, for the split's finishing step (JSON): its shards, and what a
        subclass writes beside them, vouched for as ``files`` and ``stretches`` (the module's words)."""
        return {"first_shard": self.part.first_shard, "shards": [s.to_json() for s in self.shards],
                "md5s": self.md5s}

    def shard_full(self) -> None:
        """The gather's plan says the shard being filled ends here: close it now rather than when
        the next sample comes (the same bytes), so that the gather records it and gives back the
        spill it read at once. The base writer leaves it to the next sample."""

    def settle(self) -> None:
        """Count in ``shards`` every shard finished by now (a writer that finishes shards in the
        background); the base writer's shards are counted when finished."""

    @property
    def shards_alone(self) -> bool:
        """Whether ``shard_piece`` records each finished shard alone: a gather by this writer then
        gives back the spill behind it as it goes (``engine/shuffle/release.py``), with any ``--workers``.
        Not a writer whose piece is more than its shards (a split-wide file written in pieces)."""
        return self.rangeable and type(self).piece is Writer.piece

    def shard_piece(self, i: int) -> dict[str, Any] | None:
        """``piece()`` of this writer's ``i``-th finished shard alone (a gather resumes after it and
        gives back the spill it read: ``engine/shuffle/release.py``); None when not ``shards_alone``."""
        if not self.shards_alone or len(self.md5s) not in (0, len(self.shards)):
            return None
        return self.one_shard(i)

    def one_shard(self, i: int) -> dict[str, Any]:
        """The base ``piece()`` of the ``i``-th finished shard alone (what ``shard_piece`` builds on)."""
        return {"first_shard": self.part.first_shard + i, "shards": [self.shards[i].to_json()],
                "md5s": self.md5s[i:i + 1]}

    def finish_split(self, pieces: list[dict[str, Any]]) -> dict[str, Any]:
        """Split-wide files made once every shard of the split is written, from the ``piece()`` of
        every writer that made some (on a writer made for this, which wrote nothing)."""
        return {}

    def join_shards(self, splits: dict[str, list[ShardRecord]], *, replaced: Replaced) -> None:
        """Rewrite written shards whose bytes depend on every split's (parquet: each file given the
        dataset's one schema, ``formats/parquet/joined.py``), once all are written and before any
        ``finish_split``; ``splits``: each split's shard records, in order. ``replaced(split, k,
        record)`` is told of the ``k``-th shard's new file while it is whole under a temporary name,
        before it takes the shard's name: a run killed in between finds the shard's piece naming the
        new file, and a shard not as its piece says is gathered again. On a writer made for this,
        which wrote nothing; the base writer rewrites nothing."""

    def write_batch(self, lengths: np.ndarray, payload: memoryview) -> None:
        raise NotImplementedError

    # False: the writer keeps nothing of a batch's buffers once ``write_sorted`` returns (it decodes
    # them into arrays of its own), so the gather reuses one buffer for every group it reads
    keeps_batches: ClassVar[bool] = True

    def write_sorted(self, batch: SortedBatch) -> None:
        """A gathered batch; writers that decode records read them in place (``batch.source`` at
        ``batch.starts``) instead of from a sorted copy."""
        self.write_batch(batch.lengths, batch.payload)

    # True: the gather hands ``write_mapped`` batches whose payloads lie in the part files' mapped
    # pages (a writer that copies each payload once, into its output, spares a copy in fresh memory)
    maps_parts: ClassVar[bool] = False

    def write_mapped(self, batch: MappedBatch) -> None:
        raise NotImplementedError

    def preload(self) -> None:
        """Import what writing needs (called in the parent while the scatter runs, so that forked
        gather workers inherit the modules)."""

    def close(self) -> list[ShardRecord]:
        raise NotImplementedError
