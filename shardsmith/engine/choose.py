"""Which registered source reads a job's inputs and which format writes them: the source named
(``--from``) or found from the inputs' suffixes, its events reading where the options or the
format ask for it, and the format from ``--to`` and what the source holds (``registry.format_for``)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from shardsmith import registry
from shardsmith.core.file_listing import CHUNK
from shardsmith.core.input_file import InputFile
from shardsmith.errors import UsageError, install_hint
from shardsmith.kit.format import Format
from shardsmith.kit.reader import Reader

if TYPE_CHECKING:
    from shardsmith.engine.job import JobRun


def infer_source(files: Sequence[InputFile], sources: dict[str, type[Reader]]) -> str:
    """The source from the inputs' suffixes (one kind per conversion); a source whose suffixes another
    claims too (Parquet as events) is never inferred: its plain reading is."""
    variants = {cls.events_variant for cls in sources.values()}
    suffixes = {name: cls.suffixes for name, cls in sources.items() if name not in variants}
    # every path, each ended by a NUL (never part of a path): "x.jsonl.gz\0" holds ".jsonl.gz\0"
    # exactly when the path ends with that suffix -- a few C-speed searches, not a test per file;
    # a chunk of paths at a time (a listing on disk is never held whole)
    kinds: set[str] = set()
    for chunk in _path_chunks(files):
        kinds |= {kind for kind, sfx in suffixes.items() if any(s + "\0" in chunk for s in sfx)}
    if len(kinds) > 1:
        raise UsageError(f"the inputs hold several kinds ({', '.join(sorted(kinds))}); choose one with --from")
    if not kinds:
        raise UsageError("no input file has a suffix a source reads; choose one with --from")
    return kinds.pop()


def _path_chunks(files: Sequence[InputFile]) -> Iterator[str]:
    """The files' paths, lowercased, each ended by a NUL, a chunk of them to a string."""
    for start in range(0, len(files), CHUNK):
        yield ("\0".join([f.path for f in files[start:start + CHUNK]]) + "\0").lower()


def suffixes_of(sources: dict[str, type[Reader]]) -> tuple[str, ...]:
    """Every suffix the sources read, each once (Parquet is read as rows and as events)."""
    return tuple(dict.fromkeys(s for c in sources.values() for s in c.suffixes))


def source_and_format(run: JobRun) -> tuple[type[Reader], Format]:
    """The job's source class and format; an inferred source lists the inputs (``run.files``: exactly
    that source's files, since one kind is inferred)."""
    sources = registry.loaded("source")
    name = run.job.source
    if name is None:
        # a source whose extra is not installed still claims its suffixes, so its files are named with the extra
        absent = {sfx: p for p in registry.unavailable("source") for sfx in p.suffixes}
        files = run.discover(tuple(dict.fromkeys((*suffixes_of(sources), *absent))))
        if absent:
            for f in files:
                for sfx, p in absent.items():
                    if f.path.lower().endswith(sfx):
                        raise UsageError(f"{f.path}: the {p.name} source reads it, and needs "
                                         f"{', '.join(p.missing())}, which is not installed: {install_hint(p.extra)}")
        name = infer_source(files, sources)
    cls = sources.get(name) or registry.get("source", name)
    if cls.events_variant and (cls.wants_events(run.opts) or not registry.formats_for(option=run.job.format,
                                                                                        holds=cls.holds)):
        cls = registry.get("source", cls.events_variant)
    registry.record_kind(cls.holds, source=cls.name)  # a kind no package registers: one line naming the source
    return cls, registry.format_for(option=run.job.format, holds=cls.holds)
