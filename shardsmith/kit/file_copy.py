"""Whole input files written unchanged as samples: what the engine's copy mode (``engine/copying/image_copy.py``)
plans and runs, and what a format that can take files unchanged (``Format.copies_files``) gives it.

The engine plans every shard from the listing alone (keys, order, shard boundaries) and hands
out the writing of each planned shard; the format knows how much a file weighs in its shards, how
a shard is named and written, and what a split adds when its shards are done (an index).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from shardsmith.core.input_file import InputFile
from shardsmith.kit.writer import ShardRecord


@dataclass(frozen=True, slots=True, kw_only=True)
class FileShard:
    """One planned shard: its files in output order, and the file it becomes in ``out_dir``."""

    out_dir: str
    split: str
    index: int
    name: str
    files: tuple[InputFile, ...]

    @property
    def nbytes(self) -> int:
        return sum(f.size for f in self.files)


class ImageSamples(Protocol):
    """What makes an image's sample (``kit.image_processor.ImageProcessor``): its key and label, a
    shard's worth at a time, and its extension once its bytes are read and checked."""

    def image_keys(self, files: Sequence[InputFile]) -> list[str]: ...

    def image_labels(self, files: Sequence[InputFile]) -> list[bytes]: ...

    def image_ext(self, file: InputFile, data: memoryview) -> str: ...


class FileCopier(Protocol):
    """A format's side of the copy mode (``Format.file_copier``); picklable, sent to the workers once."""

    max_weight: int  # the most a shard holds, in ``weights`` units (rolled over before it would exceed)
    max_samples: int | None  # the most samples a shard holds (None: no such limit)

    def weights(self, sizes: np.ndarray) -> np.ndarray:
        """What each file of ``sizes`` bytes weighs in a shard (with its headers, padding, label)."""
        ...

    def shard_name(self, split: str, index: int) -> str:
        """The file name of a split's ``index``-th shard."""
        ...

    def shard_files(self, shard: FileShard) -> list[str]:
        """Every file writing ``shard`` makes, relative to the folder (removed again if the run fails)."""
        ...

    def write(self, shard: FileShard, samples: ImageSamples) -> tuple[ShardRecord, Any]:
        """Write the shard whole (read, check, append each file); its record and what the split's
        ``finish_split`` takes of it."""
        ...

    def finish_split(self, out_dir: Path, split: str, written: list[tuple[ShardRecord, Any]]) -> None:
        """A split's own files once its shards are written (an empty split too)."""
        ...
