"""The store of an output URL: ``objstore.Store`` for any fsspec filesystem that writes, with what a
scheme's own store adds (``s3store.S3Store``); ``schemes.SCHEMES`` says which schemes write."""

from __future__ import annotations

from shardsmith.core.urls import safe_url
from shardsmith.errors import UsageError
from shardsmith.storage import retry, schemes
from shardsmith.storage.objstore import PART_SIZE, Store
from shardsmith.storage.s3store import S3Store

STORES: dict[str, type[Store]] = {"s3": S3Store}  # what a scheme's store adds (schemes.SCHEMES: which write)


def open_store(url: str, *, policy: retry.Policy, part_size: int = PART_SIZE) -> Store:
    """The store of an output URL (a fresh filesystem, made as the table of schemes says: no listing
    cached from another run, the client's own retries off), or one line saying what to install."""
    scheme = schemes.check(url, role="outputs").name
    if not url[len(scheme) + 3:].strip("/"):
        raise UsageError(f"-o {safe_url(url)}: name a bucket (and a prefix): {scheme}://BUCKET/PREFIX")
    fs = schemes.filesystem([url], role="outputs")
    return STORES.get(scheme, Store)(url=url, fs=fs, policy=policy, part_size=part_size)
