"""What a plugin imports: the protocols and the types they use, in one stable place.

A third-party package writes a source (``Source``, whose records become a neutral ``Sample``), a
transform (``Transform``), a format (``Format`` with its ``Writer``, which reads each ``Sample`` back
with ``Sample.decode`` or gives its own ``SampleEncoder``, for events its own ``EventEncoder``, and a ``Dataset``: length, ``read``, ``kind``, which gives it
``ds.iter``, the torch adapters and mixtures) or a kind of record a source holds (``RecordKind``,
with its report ``Section``s and ``Table``s, read within ``Sampling``) against these names and registers it through an
entry point (docs/design.md, "Plugins"); ``shardsmith.testing`` holds the conformance tests it
runs. The modules behind these names may move; these names stay. A format's options module, which
``convert --help`` imports, takes ``Option`` and ``FormatOptions`` from ``shardsmith.kit.options``
instead: this module imports numpy.
"""

from __future__ import annotations

from shardsmith.core.events import EventChunk, EventSchema
from shardsmith.core.input_file import InputFile
from shardsmith.core.own_files import Folder, OwnFiles
from shardsmith.errors import DataError, DatasetError, UsageError
from shardsmith.kit.dataset import Dataset
from shardsmith.kit.event_codec import EventEncoder, EventRecords
from shardsmith.kit.format import Format, Rate, WriteJob
from shardsmith.kit.options import FormatOptions, Option, OptionValues
from shardsmith.kit.reader import BadRecord, Reader, RecordError, StreamError, Task
from shardsmith.kit.record_kind import RecordKind
from shardsmith.kit.sample import OTHER_FIELDS, Sample, SampleEncoder
from shardsmith.kit.sample_kind import ArraysForm, BatchForm, EventForm, ListForm, MappingForm, SampleKind
from shardsmith.kit.sections.model import Sampling, Section, Table
from shardsmith.kit.transform import Transform
from shardsmith.kit.writer import SHARD_NAMES, ShardRange, ShardRecord, Writer

Source = Reader  # a source is a Reader subclass

__all__ = ["OTHER_FIELDS", "SHARD_NAMES", "ArraysForm", "BadRecord", "BatchForm", "DataError", "Dataset", "DatasetError",
           "EventChunk", "EventEncoder", "EventForm", "EventRecords", "EventSchema", "Folder", "Format", "FormatOptions", "InputFile",
           "ListForm", "MappingForm", "Option", "OptionValues", "OwnFiles", "Rate", "Reader", "RecordError",
           "RecordKind", "Sample", "SampleEncoder", "SampleKind", "Sampling", "Section", "ShardRange", "ShardRecord", "Source", "StreamError",
           "Table", "Task", "Transform", "UsageError", "WriteJob", "Writer"]
