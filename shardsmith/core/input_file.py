"""One input file of a run: where it is, and the relative path that names its records."""

from __future__ import annotations

from typing import NamedTuple


class InputFile(NamedTuple):
    """One input file: where it is, and the relative path that names its records.

    A named tuple, not a dataclass: an image folder has millions of them, and a tuple is made
    (and pickled) several times faster than a frozen dataclass instance.
    """

    path: str
    rel: str
    index: int
    size: int
    group: str = ""  # first folder below the input argument it was found in (an image folder's class)
    mtime_ns: int = 0  # when its content was last changed (as the file says: it can be set back)
    # when its inode last changed (any write, truncation or rename sets it, and nothing can set it
    # back) and which inode it is: with the size, what a rerun trusts to reuse finished work, and
    # what a run checks to know that the file did not change while it was read (``changed``)
    ctime_ns: int = 0
    ino: int = 0
    # a file staged from object storage (``engine/inputs/url_inputs.py``): "URL\0ETAG" of the object it is a copy
    # of, which a rerun trusts instead of the copy's own times ("" for a local file)
    origin: str = ""
