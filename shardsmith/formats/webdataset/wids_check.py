"""``verify`` of a split's wids index against the manifest's shards: its sha256 agreeing with a
manifest made to agree with it says nothing of its shard list, so the list itself is read."""

from __future__ import annotations

import posixpath
from collections.abc import Callable
from typing import Any

import orjson

from shardsmith.errors import DatasetError


def wids_problems(read: Callable[[str], bytes], manifest: dict[str, Any], *, failed: set[str]) -> list[str]:
    """Each split's wids index against the shards it lists, whether ``files`` lists it or not (but
    one in ``failed``, whose size or sha256 was found wrong already)."""
    problems = []
    for split in manifest["splits"].values():
        wids = split.get("wids")
        if isinstance(wids, str) and wids not in failed:
            problems += check_wids(read, wids, split["shards"])
    return problems


def check_wids(read: Callable[[str], bytes], rel: str, shards: list[dict[str, Any]]) -> list[str]:
    try:
        index = orjson.loads(read(rel))
        here = posixpath.dirname(rel)  # urls are relative to the index (``__index__/``: ``../train-000000.tar``)
        listed = [(posixpath.normpath(posixpath.join(here, e["url"])), e["nsamples"], e["filesize"])
                  for e in index["shardlist"]]
    except DatasetError as exc:
        return [str(exc)]
    except OSError as exc:
        return [f"{rel}: cannot read ({exc.strerror or exc})"]
    except (ValueError, KeyError, TypeError, AttributeError):
        return [f"{rel}: not a wids shard index"]
    if index.get("__kind__") != "wids-shard-index-v1" or type(index.get("wids_version")) is not int \
            or index.get("wids_version") != 1:
        return [f"{rel}: not a wids shard index (its __kind__ and wids_version are not wids' version 1)"]
    want = [(s["path"], s["samples"], s["bytes"]) for s in shards]
    # of the same types too: a count of True or 1.0 is not the manifest's 1
    if [tuple(map(type, e)) for e in listed] != [(str, int, int)] * len(listed) or listed != want:
        return [f"{rel}: its shard list differs from the manifest's shards"]
    return []
