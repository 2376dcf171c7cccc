"""The bytes of a webdataset tar shard: deterministic POSIX ustar headers out, strict parsing in.

The one module the writers and loaders import from; the work lives in ``tarheader`` (writing and
parsing headers one at a time), ``tarcheck`` (thousands of shardsmith's own headers at once in
numpy), ``tarscan`` (a shard's member table from its headers) and ``tarindex`` (the offset index).
``scan_samples`` stays here: it looks ``parse_sample`` and ``_SAMPLES`` up in this module when
called, so replacing them here (as the tests do) reaches the scan.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from shardsmith.formats.webdataset.tarcheck import Headers, check_headers

# (the underscored names: image_tar builds its headers from the template; tests read _FREE_LEVELS)
from shardsmith.formats.webdataset.tarheader import (
    _CONST_SUM,  # noqa: F401
    _HEAD,  # noqa: F401
    _HEADER,  # noqa: F401
    _MID,  # noqa: F401
    _TAIL,  # noqa: F401
    _ZEROS,  # noqa: F401
    BLOCK,
    MAGIC,
    MAX_NAME,
    MAX_SIZE,
    RECORD,
    end_of_archive,
    member_header,
    padding,
    parse_header,
    parse_members,
    parse_sample,
    sample_members,
)
from shardsmith.formats.webdataset.tarindex import (
    INDEX_MAGIC,
    INDEX_VERSION,
    index_array,
    index_members,
    index_offsets,
    is_index_v2,
)
from shardsmith.formats.webdataset.tarscan import _FREE_LEVELS, ShardMembers, _Scan  # noqa: F401

__all__ = [
    "BLOCK", "INDEX_MAGIC", "INDEX_VERSION", "MAGIC", "MAX_NAME", "MAX_SIZE", "RECORD", "Headers", "ShardMembers",
    "check_headers", "end_of_archive", "index_array", "index_members", "index_offsets", "is_index_v2",
    "member_header", "padding", "parse_header", "parse_members", "parse_sample", "sample_members", "scan_samples",
]

_SAMPLES = 1 << 15  # samples scanned together: bounds the (samples, 100) name arrays


def scan_samples(buf: Any, offsets: Any, *, where: str = "tar") -> ShardMembers:
    """``parse_sample`` of every sample ``offsets`` (n + 1 byte positions) delimit, in numpy.

    Samples are walked one member level at a time: the headers of every sample's k-th member are
    checked together (``check_headers``), names split at their first dot, keys compared, ranges
    filled. A sample with any header that is not ``member_header``'s own, any doubt about a name,
    or any fault goes through ``parse_sample``, so foreign headers parse and faults raise exactly
    as there (the first faulty sample in order raises).
    """
    bounds = np.asarray(offsets, dtype=np.int64).reshape(-1)
    n = max(len(bounds) - 1, 0)
    scan = _Scan(buf, bounds, where, parse_sample)
    for a in range(0, n, _SAMPLES):
        scan.block(a, min(a + _SAMPLES, n))
    return scan.finish()

