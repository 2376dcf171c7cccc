"""What makes a rerun the *same* run: a fingerprint of the command, its options and its inputs.

A killed conversion leaves its finished part files in the work folder beside the output. Running
the same command again (same options, same unchanged inputs) reuses them; anything else starts
over. The output folder remembers which command is filling it (``.shardsmith-run.json``), so a
different command is refused there unless ``--overwrite``. Workers, progress, ``--overwrite`` and
the retries of object storage never change the bytes, so they are not part of the identity.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import orjson

from shardsmith.core.file_listing import CHUNK
from shardsmith.core.input_file import InputFile
from shardsmith.core.manifest import RUN_FILE
from shardsmith.core.urls import is_url

VOLATILE = frozenset({"workers", "quiet", "overwrite", "stage", "rank", "world_size", "retries", "retry_wait",
                      "staging", "part_size", "out_url", "removed"})
# the options that name a local file or folder (the command line's and the options' own names): the same
# job named two ways (``data`` from its parent folder, ``./data``, ``/home/me/data``) is the same run
PATH_OPTIONS = frozenset({"inputs", "out", "tokenizer", "chat_template", "events_table", "decontaminate"})


def resolved(value: Any) -> Any:
    """A path option's value (a path, or a tuple of them) as the absolute path it names, symbolic
    links followed; URLs (and None) as they are."""
    if isinstance(value, tuple | list):
        return tuple(resolved(v) for v in value)
    if isinstance(value, str | os.PathLike) and not is_url(str(value)):
        return os.path.realpath(value)
    return value


def _digest(value: Any) -> str:
    try:
        text = orjson.dumps(value, option=orjson.OPT_SORT_KEYS, default=str)
    except TypeError:  # a path with bytes that are not UTF-8 (surrogates): escaped, losslessly
        import json

        text = json.dumps(value, sort_keys=True, default=str, separators=(",", ":")).encode()
    return hashlib.sha256(text).hexdigest()[:32]


def run_identity(command: str, opts: Any, files: Sequence[InputFile], *, extra_paths: tuple[str | None, ...] = ()
                 ) -> dict[str, str]:
    """``{"command", "options", "inputs"}``: who is filling the folder, and with what exactly.

    What a rerun trusts of an input: its path, size, inode, mtime and ctime. Any write (or
    truncation, or a copy put in its place) changes the ctime, which no user can set back (``touch
    -d`` sets the mtime only), so an input edited in place is never taken for the one a part was made
    from. Where a file system keeps no ctime (0), the input's content is hashed instead. Files named
    by options (a tokenizer, an events table) are hashed whole. Paths count as the files they name
    (``PATH_OPTIONS``): a relative path and the absolute one of the same folder are the same run. A
    file staged from object storage stands for its object (URL, size, ETag), so a rerun that finds it
    staged again resumes.
    """
    options = {k: resolved(v) if k in PATH_OPTIONS else v for k, v in dataclasses.asdict(opts).items()
               if k not in VOLATILE}
    if getattr(opts, "out_url", None):  # into object storage: the URL, not the staging folder of this machine
        options["out"] = opts.out_url
    extra = [(resolved(p), _sha256(p)) for p in extra_paths if p and os.path.isfile(p)]
    return {"command": command, "options": _digest({"command": command, "options": options}),
            "inputs": _digest_list(lambda: _chunks(files, extra))}


def _chunks(files: Sequence[InputFile], extra: list[tuple[str, str]]) -> Iterator[list[Any]]:
    """What a rerun trusts of each input (as ``run_identity`` says), a chunk of inputs at a time (a
    listing on disk is never held whole), then ``extra``."""
    for start in range(0, len(files), CHUNK):
        yield [(f.rel, f.size, f.origin) if f.origin  # staged: the object, not the copy
               else (f.rel, f.size, f.ino, f.mtime_ns, f.ctime_ns) if f.ctime_ns
               else (f.rel, f.size, _sha256(f.path)) for f in files[start:start + CHUNK]]
    yield extra


def _digest_list(chunks: Callable[[], Iterator[list[Any]]]) -> str:
    """``_digest`` of the list the ``chunks()`` make together, without holding it: a JSON array's
    text is its items' texts joined by commas, so the hash takes each chunk's as it comes."""
    try:
        return _hash_array(chunks(), lambda chunk: orjson.dumps(chunk))
    except TypeError:  # as ``_digest``: a path with bytes that are not UTF-8, escaped losslessly
        import json

        return _hash_array(chunks(), lambda chunk: json.dumps(chunk, default=str, separators=(",", ":")).encode())


def _hash_array(chunks: Iterator[list[Any]], dumps: Callable[[list[Any]], bytes]) -> str:
    h = hashlib.sha256(b"[")
    first = True
    for chunk in chunks:
        if chunk:
            h.update(dumps(chunk)[1:-1] if first else b"," + dumps(chunk)[1:-1])
            first = False
    h.update(b"]")
    return h.hexdigest()[:32]


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(8 << 20):
            h.update(block)
    return h.hexdigest()


def die_with_parent() -> None:
    """In a worker: be killed when the parent dies (Linux), so a run killed by the out-of-memory
    killer or a preempted job leaves no orphan workers holding memory and open files; and leave
    Ctrl-C and SIGTERM to the parent, which stops its workers (``shardsmith.engine.processes.interrupt``)."""
    from shardsmith.engine.processes.interrupt import end_with_parent, ignore_in_worker

    ignore_in_worker()
    end_with_parent()


def read_run_file(out: Path) -> dict[str, Any] | None:
    try:
        data = orjson.loads((out / RUN_FILE).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None
