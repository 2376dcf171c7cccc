"""The one table of sources, transforms, formats and record kinds; every command dispatches through it.

Built-ins and third-party plugins register the same way: a name and a ``"module:attribute"``
target, imported only when used (as fsspec's registry does for filesystems). Packages add their
own through entry points, one group per kind (docs/design.md, "Plugins")::

    [project.entry-points."shardsmith.sources"]
    csv = "shardsmith_csv:CsvSource"

    [project.entry-points."shardsmith.formats"]
    npz = "mypkg.npz:NpzFormat"

    [project.entry-points."shardsmith.format_options"]   # optional: its options, from a light module
    npz = "mypkg.npz_options:OPTIONS"

    [project.entry-points."shardsmith.kinds"]            # a kind of record a source may hold
    pairs = "mypkg.pairs:PairsKind"

A format's options (``kit/options.py``) are read from that light module (the built-ins': their
``options.py``) so that ``convert --help`` lists them without importing any format; a format
without one is imported and its ``options`` attribute read, and one that declares none (the
protocol before formats declared options) is given the options every ``--to`` took then.
A plugin may replace a built-in of the same name. A plugin whose module fails to import is one
warning line on stderr naming it and its distribution; everything else goes on working.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from dataclasses import dataclass
from functools import cache
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

from shardsmith.errors import DatasetError, UsageError, install_hint

if TYPE_CHECKING:
    from shardsmith.core.own_files import OwnFiles
    from shardsmith.kit.format import Format
    from shardsmith.kit.options import FormatOptions

KINDS = ("source", "transform", "format", "kind")  # "kind": a record kind (``kit/record_kind.py``)
GROUPS = {kind: f"shardsmith.{kind}s" for kind in KINDS}
OPTIONS_GROUP = "shardsmith.format_options"  # format name -> "module:FormatOptions", a light module
# the options every --to took before formats declared their own: what a format declaring none is given
LEGACY_OPTIONS = ("shard_samples", "shard_bytes", "wids_md5", "compression", "events_per_sample")


@dataclass(frozen=True, slots=True)
class Plugin:
    kind: str
    name: str
    target: str
    requires: tuple[str, ...] = ()
    extra: str = ""  # the shardsmith extra that installs what it requires
    suffixes: tuple[str, ...] = ()  # a built-in source's suffixes, known without importing it (to name the extra)
    origin: str = "shardsmith"  # the distribution that registered it
    options: str = ""  # a format's options: "module:attribute" of a FormatOptions in a light module

    def missing(self) -> list[str]:
        """Modules this plugin needs that are not installed."""
        return [m for m in self.requires if importlib.util.find_spec(m) is None]

    def load(self) -> Any:
        """The registered object, imported now; a one-line UsageError if it cannot be."""
        missing = self.missing()
        if missing:
            hint = f": {install_hint(self.extra)}" if self.extra else ""
            raise UsageError(f"{self.kind} {self.name!r} needs {', '.join(missing)}, which is not installed{hint}")
        return self._import(self.target)

    def load_options(self) -> FormatOptions | None:
        """A format's declared options from its light module (None: it names none), imported now."""
        return self._import(self.options) if self.options else None

    def _import(self, target: str) -> Any:
        module, _, attr = target.partition(":")
        try:
            return getattr(importlib.import_module(module), attr)
        except Exception as exc:  # a plugin's import may fail any way at all
            raise UsageError(f"{self.kind} {self.name!r} from {self.origin}: cannot load {target} "
                             f"({type(exc).__name__}: {exc})") from None


_ROOT = ("uproot", "awkward")
BUILTIN = (
    Plugin("source", "imagefolder", "shardsmith.sources.imagefolder:ImageFolderReader"),
    Plugin("source", "jsonl", "shardsmith.sources.jsonl:JsonlReader", ("orjson",)),
    Plugin("source", "parquet", "shardsmith.sources.parquet:ParquetReader", ("pyarrow",)),
    Plugin("source", "parquet-events", "shardsmith.sources.parquet_events:ParquetEventReader", ("pyarrow",)),
    Plugin("source", "root", "shardsmith.sources.root:RootReader", _ROOT, extra="root", suffixes=(".root",)),
    Plugin("transform", "augment", "shardsmith.transforms.augment:Augmenter", ("PIL",), extra="images"),
    Plugin("transform", "select", "shardsmith.transforms.select:SelectFields"),
    Plugin("transform", "tokenize", "shardsmith.text.tokenize_rows:TokenizeText", ("tokenizers",)),
    Plugin("format", "tokens", "shardsmith.formats.tokens.format:TokensFormat", ("numpy",),
           options="shardsmith.formats.tokens.options:OPTIONS"),
    Plugin("format", "webdataset", "shardsmith.formats.webdataset.format:WebDatasetFormat",
           options="shardsmith.formats.webdataset.options:OPTIONS"),
    Plugin("format", "mds", "shardsmith.formats.mds.format:MdsFormat", ("orjson",),
           options="shardsmith.formats.mds.options:OPTIONS"),
    Plugin("format", "hdf5", "shardsmith.formats.hdf5.format:HDF5Format", ("h5py",),
           options="shardsmith.formats.hdf5.options:OPTIONS"),
    Plugin("format", "event-tar", "shardsmith.formats.event_tar.format:EventTarFormat",
           options="shardsmith.formats.event_tar.options:OPTIONS"),
    Plugin("format", "memmap", "shardsmith.formats.memmap.format:MemmapFormat", ("numpy",),
           options="shardsmith.formats.memmap.options:OPTIONS"),
    Plugin("format", "parquet", "shardsmith.formats.parquet.format:ParquetFormat", ("pyarrow",),
           options="shardsmith.formats.parquet.options:OPTIONS"),
    Plugin("format", "lance", "shardsmith.formats.lance.format:LanceFormat", ("lance", "pyarrow"), extra="lance",
           options="shardsmith.formats.lance.options:OPTIONS"),
    Plugin("format", "lance-events", "shardsmith.formats.lance.events_format:LanceEventsFormat", ("lance", "pyarrow"),
           extra="lance", options="shardsmith.formats.lance.options:OPTIONS"),
    Plugin("kind", "rows", "shardsmith.kit.kinds:RowsKind"),
    Plugin("kind", "images", "shardsmith.kit.kinds:ImagesKind"),
    Plugin("kind", "events", "shardsmith.kit.kinds:EventsKind"),
)


@cache
def _installed() -> tuple[Plugin, ...]:
    """Plugins of installed packages, from their entry points (read once per process). One scan of
    the installed distributions for every group: each ``entry_points(group=...)`` call reads
    every distribution's metadata again (tens of milliseconds of start-up per call in a large venv)."""
    installed = entry_points()
    options = {ep.name: ep.value for ep in installed.select(group=OPTIONS_GROUP)}
    found = []
    for kind, group in GROUPS.items():
        for ep in installed.select(group=group):
            origin = ep.dist.name if ep.dist is not None else "an entry point"
            found.append(Plugin(kind, ep.name, ep.value, origin=origin,
                                options=options.get(ep.name, "") if kind == "format" else ""))
    return tuple(found)


def plugins() -> list[Plugin]:
    """Built-ins, then installed plugins (a package may replace a built-in of the same name)."""
    table = {(p.kind, p.name): p for p in (*BUILTIN, *_installed())}
    return sorted(table.values(), key=lambda p: (KINDS.index(p.kind), p.name))


def _find(kind: str, name: str) -> Plugin:
    found = {(p.kind, p.name): p for p in plugins()}.get((kind, name))
    if found is None:
        names = ", ".join(p.name for p in plugins() if p.kind == kind)
        raise UsageError(f"no {kind} named {name!r} (installed: {names})")
    return found


def get(kind: str, name: str) -> Any:
    """The object registered as ``kind``/``name``, imported now."""
    return _find(kind, name).load()


def names(kind: str) -> list[str]:
    """Every registered name of a kind, without importing anything."""
    return [p.name for p in plugins() if p.kind == kind]


_warned: set[tuple[str, str]] = set()


def loaded(kind: str) -> dict[str, Any]:
    """Every usable object of a kind, imported now. One that cannot be loaded is left out with a
    warning line (once per process); one whose optional dependencies are missing is left out
    silently (``shardsmith plugins`` says what it needs)."""
    out = {}
    for p in plugins():
        if p.kind != kind or p.missing():
            continue
        try:
            out[p.name] = p.load()
        except UsageError as exc:
            _warn(p, exc)
    return out


def unavailable(kind: str) -> list[Plugin]:
    """The plugins of a kind whose optional dependencies are missing (``loaded`` leaves them out)."""
    return [p for p in plugins() if p.kind == kind and p.missing()]


def _warn(p: Plugin, exc: UsageError) -> None:
    if (p.kind, p.name) not in _warned:
        _warned.add((p.kind, p.name))
        print(f"shardsmith: warning: {exc}; it is left out", file=sys.stderr)


def format_options() -> dict[str, FormatOptions]:
    """Every usable format's declared options, by format name, read from the light modules: no
    format is imported but one that names no such module (a plugin whose class holds them, or
    declares none: then it gets ``LEGACY_OPTIONS``, as every ``--to`` took them before)."""
    declared = {p.name: p.load_options() for p in BUILTIN if p.kind == "format"}  # (all light)
    out = {}
    for p in plugins():
        if p.kind != "format" or p.missing():
            continue
        try:
            found = p.load_options() if p.options else _class_options(p, declared)
        except UsageError as exc:
            _warn(p, exc)
            continue
        if found is not None:
            out[p.name] = found
    return out


def _class_options(p: Plugin, builtin: dict[str, FormatOptions | None]) -> FormatOptions | None:
    """A format's options from its class: its ``options``, or (none declared) the legacy ones."""
    from shardsmith.kit.options import FormatOptions

    cls = p.load()
    options = getattr(cls, "options", None)
    if not getattr(cls, "option", None):
        return None
    if isinstance(options, FormatOptions):  # (a subclass of another format: its own --to, its parent's options)
        return options if options.to == cls.option else FormatOptions(to=cls.option, options=options.options,
                                                                     recorded=options.recorded)
    legacy = {o.name: o for d in builtin.values() if d is not None for o in d.options if o.name in LEGACY_OPTIONS}
    return FormatOptions(to=cls.option, options=tuple(legacy[n] for n in LEGACY_OPTIONS))


def formats() -> list[Format]:
    """Every usable format, as objects."""
    return [cls() for cls in loaded("format").values()]


def own_files() -> OwnFiles:
    """What any run may leave in an output folder: what every run leaves (``EVERY_OUTPUT``) and what
    each format declares (``Format.own_files``), so that ``--overwrite`` removes an earlier dataset of
    any format and an upload publishes every file of this one. A format whose optional dependencies
    are missing counts too (its class declares its files without them); one that cannot be imported
    does not, its files are then another tool's."""
    from shardsmith.core.own_files import EVERY_OUTPUT

    found = EVERY_OUTPUT
    for p in plugins():
        if p.kind != "format":
            continue
        try:
            cls = p._import(p.target)
        except UsageError as exc:
            if not p.missing():
                _warn(p, exc)
            continue
        declared = getattr(cls, "own_files", None)
        if isinstance(declared, type(EVERY_OUTPUT)):
            found = found | declared
    return found


def format_named(name: str) -> Format:
    return get("format", name)()


def record_kind(name: str, *, source: str = "") -> Any:
    """The record kind registered as ``name`` (what a source ``holds``), as an object (a
    ``kit.record_kind.RecordKind``, which builds transforms through this registry); a source of a
    kind no installed package registers is a one-line UsageError naming the source."""
    found = {p.name: p for p in plugins() if p.kind == "kind"}.get(name)
    if found is None:
        holder = f"source {source!r} holds" if source else "records of"
        raise UsageError(f"{holder} {name!r}, a record kind no installed package registers "
                         f"(kinds: {', '.join(names('kind'))})")
    return found.load()()


def sources_with_text() -> list[Any]:
    """Every usable source whose records have a text field (``RecordKind.text_fields``): what
    ``pack-tokens`` and ``trace`` read. A source of a kind no package registers is not one of them."""
    kinds = {name: cls() for name, cls in loaded("kind").items()}
    return [cls for cls in loaded("source").values() if getattr(kinds.get(cls.holds), "text_fields", False)]


def formats_for(*, option: str, holds: str) -> list[Format]:
    """The formats ``convert --to OPTION`` may write for records of kind ``holds`` (empty: none): those
    that accept the kind its payloads are (``RecordKind.written_as``)."""
    written = record_kind(holds).payload_kind
    return [f for f in formats() if f.option == option and written in f.accepts]


def format_for(*, option: str, holds: str) -> Format:
    """The format that ``convert --to OPTION`` writes for records of kind ``holds``."""
    matches = formats_for(option=option, holds=holds)
    if not matches:
        kinds = sorted({k for f in formats() if f.option == option for k in f.accepts})
        raise UsageError(f"--to {option} does not hold {holds}" + (f" (it holds {', '.join(kinds)})" if kinds else ""))
    return matches[0]


def to_options() -> list[str]:
    """The values of ``convert --to``: every format's option (read from the light modules)."""
    return sorted({d.to for d in format_options().values() if d.to})


def provenance(used: list[tuple[str, str]]) -> dict[str, str]:
    """``{"source csv": "shardsmith-csv 0.1.0"}`` for each object a run used that a package other than
    shardsmith registered: the manifest says which plugin, at which version, made the bytes."""
    from importlib.metadata import PackageNotFoundError, version

    found = {(p.kind, p.name): p for p in plugins()}
    out = {}
    for kind, name in used:
        p = found.get((kind, name))
        if p is None or p.origin == "shardsmith":
            continue
        try:
            out[f"{kind} {name}"] = f"{p.origin} {version(p.origin)}"
        except (PackageNotFoundError, ValueError):
            out[f"{kind} {name}"] = p.origin
    return out


def format_of(manifest: dict[str, Any], *, where: str = "") -> Format:
    """The format that reads a dataset, from its manifest."""
    for f in formats():
        if f.reads(manifest):
            return f
    raise DatasetError(f"{where}: this shardsmith cannot read {manifest.get('format')!r} datasets "
                       f"(formats installed: {', '.join(names('format'))})")
