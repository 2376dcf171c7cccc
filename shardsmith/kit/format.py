"""The format protocol: one registered object per on-disk format (docs/design.md, "Plugins").

A format is the unit of extension. It says which records it can hold, encodes each record in the
workers (``encoder``: webdataset's tar members, memmap's cut rows; by default the neutral encoding of
``kit/sample.py`` and ``kit/event_codec.py``), makes the writers the gather feeds, adds its fields to
the manifest, and reads its datasets back for the loader, ``verify --deep``, ``inspect`` (and its
HTML ``--report``) and ``bench``. Commands never ask which format they hold: they call these
methods on the object ``shardsmith.registry`` returns.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from shardsmith.core.manifest import companion_names, shard_files
from shardsmith.core.own_files import OwnFiles
from shardsmith.errors import DatasetError
from shardsmith.kit.event_codec import EventEncoder
from shardsmith.kit.options import OptionValues
from shardsmith.kit.sample import NeutralEncoder, SampleEncoder
from shardsmith.kit.writer import SHARD_NAMES

if TYPE_CHECKING:
    from shardsmith.kit.file_copy import FileCopier
    from shardsmith.kit.options import FormatOptions
    from shardsmith.kit.writer import ShardRange, Writer

# a dataset at a URL, as the hooks that read a dataset get it: its files (``kit/dataset_files.py``
# ``StreamedFiles``, not imported here: it imports the registry, which imports this module)
StreamedFiles = Any


@dataclass(frozen=True, kw_only=True)
class WriteJob:
    """What a format's writers are made from: its own options, the run's, and what the run found out.
    A format reads its own options (``options``), never the command's (``opts``: kept for the formats
    that declare none)."""

    opts: Any  # the command's options (seed, splits, workers, ...), a frozen dataclass
    out: Path
    options: OptionValues = field(default_factory=OptionValues)  # the format's own (``Format.options``), typed
    workers: int = 1  # the run's worker processes (a writer may size its own threads by them)
    # an EventSchema for events, the token dtype for tokens; for rows, the inputs' Arrow types where they
    # store them (``Reader.arrow_types``: a Parquet input's), which a format of typed columns gives back
    schema: Any = None
    sources: list[str] | None = None  # input files whose bytes a writer may copy unchanged (images)


@dataclass(frozen=True, kw_only=True)
class CardData:
    """What a format says of its dataset in the dataset card (``core.card``): how HuggingFace
    ``datasets`` reads it, in the YAML that library reads from ``README.md``, and what it cannot."""

    builder: str | None = None  # the ``datasets`` builder that reads the shards (None: it has none)
    pattern: str = ""  # a split's shards, relative to the folder: "{split}-*.tar"
    features: list[dict[str, Any]] | None = None  # ``dataset_info.features`` (None: ``datasets`` infers them)
    notes: tuple[str, ...] = ()  # lines of text: what ``datasets`` leaves out, what it needs
    # no builder: the sentence ``load_dataset(OUT)`` fails with (named as the split's data file it cannot find),
    # instead of a builder guessed from the folder's JSON files failing on a split size
    unreadable: str = ""


@dataclass(frozen=True)
class Rate:
    """A loader throughput that ``bench`` measured: the figure, its unit, and a line saying it."""

    value: float
    unit: str
    line: str


def timed_batches(ds: Any, *, out: Path, split: str, batch_size: int, seconds: float,
                  measure: Callable[[Any], tuple[int, int]], how: str) -> Rate:
    """``bench`` of a batch loader: shuffled epochs (seed 0, a new one whenever one ends) for
    ``seconds``; ``measure(batch)`` is its (events, bytes); ``how`` says how the batches were read."""
    if len(ds) == 0:
        raise DatasetError(f"{out}: split {split!r} is empty")
    events = nbytes = epoch = 0
    it = ds.iter(shuffle=True, seed=0, epoch=epoch, batch_size=batch_size)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        batch = next(it, None)
        if batch is None:
            epoch += 1
            it = ds.iter(shuffle=True, seed=0, epoch=epoch, batch_size=batch_size)
            continue
        n, b = measure(batch)
        events, nbytes = events + n, nbytes + b
    elapsed = time.perf_counter() - t0
    rate = events / elapsed
    return Rate(rate, "events/s", f"{out} [{split}]: {rate:,.0f} events/s, {nbytes / elapsed / 1e6:,.0f} MB/s "
                f"(batches of {batch_size}, {how}, one process)")


class Format:
    """Base class of formats. Contract (``shardsmith.testing.FormatContract`` checks it):

    - ``writer`` makes writers whose shards depend only on the samples they are given, in order,
      and on the options: never on workers, ranks or timing (same bytes for any ``--workers``);
    - every file a writer makes is listed with its size and sha256 (``ShardRecord``), so
      ``verify`` checks it;
    - ``open`` returns a dataset with ``len``, ``ds[i]``, ``get_batch`` and ``iter`` whose
      random access equals iteration in order, and which opens no path outside the folder;
    - every file it writes into the output is one of ``own_files``, so that ``--overwrite`` removes
      it, a rerun takes it over and an output in object storage publishes it.
    """

    name: ClassVar[str] = ""  # the registry name
    manifest_format: ClassVar[str] = ""  # the manifest's "format" (a format may share one: event-tar)
    option: ClassVar[str | None] = None  # the value of ``convert --to`` that picks it (None: its own command)
    accepts: ClassVar[tuple[str, ...]] = ()  # the record kinds it holds: "images", "rows", "events", "tokens"
    sample_unit: ClassVar[str] = "sample"  # what ``len(dataset)`` counts
    copies_files: ClassVar[bool] = False  # whether ``file_copier`` takes whole input files as samples
    # the options only this format reads (``kit/options.py``; its writers get them as ``job.options``),
    # best kept in a light module the registry names too (docs/design.md, "Plugins"). None: it
    # declares none (the protocol before formats declared options): it is given the options every
    # ``--to`` took then, and reading them as ``job.opts.NAME`` is deprecated
    options: ClassVar[FormatOptions | None] = None
    # what its writers may leave in an output folder (``core/own_files.py``): names at the top of it,
    # and folders of its own with what they hold (an index folder; a shard or a whole dataset written
    # as a folder: ``Folder("*.lance")``). The manifest, the run record, the card and temporary files
    # are every run's. A format that declares none owns the names ``Writer.shard_name`` gives.
    own_files: ClassVar[OwnFiles] = OwnFiles(files=(SHARD_NAMES,))

    # -- writing ------------------------------------------------------------------------------
    def check(self, job: WriteJob) -> None:
        """Refuse options or a schema this format cannot write (a UsageError), before any work."""

    def encoder(self, job: WriteJob, kind: str) -> SampleEncoder | EventEncoder:
        """The worker-side encoder of records of the kind ``kind`` (the kind the format ``accepts``
        that the records are written as) into the bytes its writers are handed, one record after
        another: a ``SampleEncoder`` for samples (rows, images), an ``EventEncoder`` for events
        (``kit/event_codec.py``). By default the neutral encoding of either (``NeutralEncoder``),
        which the writer reads back with ``Sample.decode`` or ``core.events.decode``: a format
        decides its layout itself."""
        return NeutralEncoder()

    def writer(self, job: WriteJob, split: str, part: ShardRange) -> Writer:
        """A writer of one split's shards (all of them, or the range ``part`` names)."""
        raise NotImplementedError

    def file_copier(self, job: WriteJob) -> FileCopier:
        """Whole input files (images) written unchanged as samples, without the shuffle pass
        (``copies_files``): how this format weighs, names and writes the shards the engine plans
        from the listing alone (``engine/copying/image_copy.py``)."""
        raise NotImplementedError

    def split_fields(self, job: WriteJob, split: str, output: Any) -> dict[str, Any]:
        """Fields of a split's manifest entry beyond samples and shards (``output``: ``SplitOutput``)."""
        return {}

    def manifest_fields(self, job: WriteJob, outputs: dict[str, Any]) -> dict[str, Any]:
        """Top-level manifest fields this format adds."""
        return {}

    def side_files(self, manifest: dict[str, Any]) -> list[str]:
        """Split-wide files that fields of this format's own name (a tokenizer, a wids index), which
        the manifest's ``files`` records with their size and sha256 when it is saved, beside the
        ``companions`` every format may name (``kit/manifest_io.py``)."""
        return []

    def split_files(self, manifest: dict[str, Any]) -> list[dict[str, Any]]:
        """Split-wide files that this format's writers hashed as they wrote them, as the file
        entries (``path``, ``bytes``, ``sha256``) fields of its own record (nanoGPT's flat
        ``{split}.bin``): ``verify`` checks them, a rerun finds them intact or not, the card lists them."""
        return []

    def validate(self, manifest: dict[str, Any], bad: Any) -> None:
        """Type-check the manifest fields this format's readers read, raising ``bad(message)``
        (``core.manifest.check`` has checked the common fields: splits, shards, paths)."""

    # -- reading ------------------------------------------------------------------------------
    def reads(self, manifest: dict[str, Any]) -> bool:
        """Whether this format reads the dataset a manifest describes."""
        return manifest.get("format") == self.manifest_format

    def open(self, out_dir: str | Path, *, split: str, decode: str | None = None) -> Any:
        """The loader's dataset of one split (``shardsmith.loader.open``)."""
        raise NotImplementedError

    def verify_layout(self, out: Path | StreamedFiles, manifest: dict[str, Any], split: str) -> list[str]:
        """``verify`` (also without ``--deep``): what the format's own descriptions say of the files,
        checked without reading the data (cheap); the problems found, one line each. ``out``, here
        and in ``verify_deep``, ``describe`` and ``show``: the dataset's folder, or for a dataset at a
        URL the files the loader reads it through (``kit/dataset_files.py``), which ``open`` takes too."""
        return []

    def verify_files(self, read: Callable[[str], bytes], manifest: dict[str, Any], *, failed: set[str]) -> list[str]:
        """``verify`` (also without ``--deep``), whatever else it found: the split-wide files this
        format's fields name, against what they describe (a wids index's shard list); ``read(rel)``
        gives a file's bytes (OSError or DatasetError when it cannot), ``failed`` names the files
        whose size or sha256 was found wrong already. The problems found, one line each."""
        return []

    def verify_deep(self, out: Path | StreamedFiles, manifest: dict[str, Any], split: str) -> list[str]:
        """``verify --deep``: every sample opened; the problems found, one line each."""
        return []

    def describe(self, out: Path | StreamedFiles, manifest: dict[str, Any]) -> dict[str, Any]:
        """``inspect``: what this format adds to the summary (shown as ``key: value`` lines)."""
        return {}

    def card(self, out: Path, manifest: dict[str, Any]) -> CardData:
        """What the dataset card (``README.md``) says of this format; made from the manifest (and the
        shards' own indexes where it helps), never from the time or the folder's place."""
        return CardData()

    def report(self, out: Path, manifest: dict[str, Any], sampling: Any) -> list[Any]:
        """``inspect --report``: this format's sections of the HTML report
        (``kit.sections.model.Section`` objects), after the splits and shards every dataset has.
        ``sampling`` (``kit.sections.model.Sampling``) bounds what they read: a seeded sample, a deadline."""
        return []

    def show(self, out: Path | StreamedFiles, manifest: dict[str, Any], n: int) -> list[dict[str, Any]]:
        """``inspect``: the first ``n`` samples of the first split that has any, each as a dict of short
        values (``show_one``)."""
        split = first_split(manifest)
        if split is None or n == 0:
            return []
        ds = self.open(out, split=split)
        return [{"split": split, "index": i, **self.show_one(ds[i])} for i in range(min(n, len(ds)))]

    def show_one(self, sample: Any) -> dict[str, Any]:
        """What ``inspect`` prints of one sample: short values only."""
        return {}

    def bench(self, out: Path, *, split: str, seq_len: int | None, batch_size: int, seconds: float) -> Rate:
        """``bench``: the loader's throughput on this machine, serving ``split`` for ``seconds``."""
        raise NotImplementedError(f"bench does not measure {self.name} datasets")


def shard_entries(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """Every shard's file entry and its companions' (``core.manifest.shard_files``), split by split."""
    return [e for split in manifest["splits"].values() for shard in split["shards"] for e in shard_files(shard)]


def manifest_files(manifest: dict[str, Any], fmt: Format) -> list[dict[str, Any]]:
    """Every file entry a manifest lists (path, bytes, sha256): the shards and their companions,
    the split-wide files its format records (``Format.split_files``), and ``files``; what ``verify``
    checks and a rerun finds intact or not."""
    return [*shard_entries(manifest), *fmt.split_files(manifest), *(manifest.get("files") or [])]


def recorded_names(manifest: dict[str, Any], fmt: Format) -> list[str]:
    """The split-wide files the manifest's ``files`` records: the format's and the ``companions``."""
    return [*fmt.side_files(manifest), *companion_names(manifest)]


def first_split(manifest: dict[str, Any]) -> str | None:
    """The first split that holds samples (what ``inspect`` shows)."""
    return next((s for s, v in manifest["splits"].items() if v["samples"]), None)
