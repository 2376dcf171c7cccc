"""``batched(items, n)``: lists of ``n`` items in order, the last shorter (Python 3.12's
``itertools.batched``, as lists, on the 3.10 and 3.11 this project supports): the one way an
iterable is cut into runs, for a scatter task's records and a listing's files alike."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import islice
from typing import TypeVar

T = TypeVar("T")


def batched(items: Iterable[T], n: int) -> Iterator[list[T]]:
    """Runs of ``n`` items (at least one each), read from ``items`` as they are taken."""
    if n < 1:
        raise ValueError(f"batched: n={n}, at least 1")
    it = iter(items)
    while batch := list(islice(it, n)):
        yield batch
