"""Name → ``"module:Class"`` tables of readers, transforms and writers, imported only when used.

Third-party packages add their own through the ``shardsmith.plugins`` entry-point group, with
names ``reader.NAME``, ``transform.NAME`` or ``writer.NAME`` (as fsspec's registry does for
filesystems), e.g. in pyproject.toml::

    [project.entry-points."shardsmith.plugins"]
    "reader.icecube" = "mypkg.icecube:IceCubeReader"
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from shardsmith.errors import UsageError

KINDS = ("reader", "transform", "writer")
GROUP = "shardsmith.plugins"


@dataclass(frozen=True, slots=True)
class Plugin:
    kind: str
    name: str
    target: str
    requires: tuple[str, ...] = ()
    hint: str = ""
    origin: str = "shardsmith"

    def missing(self) -> list[str]:
        """Modules this plugin needs that are not installed."""
        return [m for m in self.requires if importlib.util.find_spec(m) is None]


_BUILTIN = [
    Plugin("reader", "imagefolder", "shardsmith.sources.imagefolder:ImageFolderReader"),
    Plugin("reader", "jsonl", "shardsmith.sources.jsonl:JsonlReader", ("orjson",)),
    Plugin("reader", "parquet", "shardsmith.sources.parquet:ParquetReader", ("pyarrow",)),
    Plugin("reader", "parquet-events", "shardsmith.sources.parquet_events:ParquetEventReader", ("pyarrow",)),
    Plugin("reader", "root", "shardsmith.sources.root:RootReader", ("uproot", "awkward"), hint="'shardsmith[root]'"),
    Plugin("transform", "augment", "shardsmith.transforms.augment:Augmenter", ("PIL",), hint="'shardsmith[images]'"),
    Plugin("transform", "tokenize", "shardsmith.transforms.tokenize:Encoder", ("tokenizers", "gigatoken")),
    Plugin("writer", "tokens", "shardsmith.formats.tokens.writer:TokensWriter", ("numpy",)),
    Plugin("writer", "webdataset", "shardsmith.formats.webdataset.writer:TarWriter"),
    Plugin("writer", "hdf5", "shardsmith.formats.hdf5.writer:HDF5Writer", ("h5py",)),
    Plugin("writer", "event-tar", "shardsmith.formats.event_tar.writer:EventTarWriter"),
]


def plugins() -> list[Plugin]:
    """Built-in plugins, then those of installed packages (a package may replace a built-in name)."""
    table = {(p.kind, p.name): p for p in _BUILTIN}
    for ep in entry_points(group=GROUP):
        kind, _, name = ep.name.partition(".")
        if kind in KINDS and name:
            origin = ep.dist.name if ep.dist is not None else "entry point"
            table[(kind, name)] = Plugin(kind, name, ep.value, origin=origin)
    return sorted(table.values(), key=lambda p: (KINDS.index(p.kind), p.name))


def get(kind: str, name: str) -> Any:
    """The class registered as ``kind``/``name``, imported now."""
    found = {(p.kind, p.name): p for p in plugins()}.get((kind, name))
    if found is None:
        names = ", ".join(p.name for p in plugins() if p.kind == kind)
        raise UsageError(f"no {kind} named {name!r} (installed: {names})")
    missing = found.missing()
    if missing:
        hint = f"; install it with: pip install {found.hint}" if found.hint else ""
        raise UsageError(f"{kind} {name!r} needs {', '.join(missing)}, which is not installed{hint}")
    module, _, attr = found.target.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise UsageError(f"{kind} {name!r}: cannot load {found.target} ({exc})") from None
