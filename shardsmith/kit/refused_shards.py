"""Shards of a dataset whose size differs from the manifest's: refused when the dataset is opened, or
(``on_error="skip"``, ``shardsmith.open``) kept with their error and refused by each read, so the
loader's skip policy (``kit/skips.py``) skips their samples and the other shards serve theirs (on a
folder and at a URL alike: ``kit/dataset_files.py``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shardsmith.errors import DatasetError
from shardsmith.kit.skips import ON_ERROR


class Refused:
    """The shards of a split whose size differs from the manifest's: refused at once (``raise``), or
    (``skip``) each kept with its error, raised by every read of that shard (``check``)."""

    def __init__(self, on_error: str) -> None:
        if on_error not in ON_ERROR:
            raise ValueError(f"on_error={on_error!r}: choose 'raise' or 'skip'")
        self.on_error = on_error
        self.errors: dict[int, DatasetError] = {}

    def sized(self, s: int, check: Callable[[], Any]) -> Any:
        """``check()`` of shard s (raising DatasetError when its size is not the manifest's): its
        value, or, when shards are skipped, None and the error kept for the shard's reads."""
        try:
            return check()
        except DatasetError as error:
            if self.on_error == "raise":
                raise
            self.errors[s] = error
            return None

    def check(self, s: int) -> None:
        error = self.errors.get(s)
        if error is not None:
            raise DatasetError(str(error))
