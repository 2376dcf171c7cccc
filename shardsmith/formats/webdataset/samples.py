"""An image's tar sample, built in the worker (members and all), so the gather only appends bytes.

Images go in unchanged (a reference the tar writer copies from the input file) or augmented
(``transforms.augment``), each with its ``cls`` member. Rows are encoded by ``members.py`` (the
format's ``encoder``), from the neutral samples the worker makes of them (``kit/row_processor.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from shardsmith.core.images import ImageError, canonical_ext, check_image
from shardsmith.core.input_file import InputFile
from shardsmith.core.sample import Identity
from shardsmith.errors import DataError
from shardsmith.formats.webdataset.tarfmt import member_header, sample_members
from shardsmith.formats.webdataset.writer import SourceRef
from shardsmith.kit.processed import Processed
from shardsmith.kit.reader import RecordError, Task


class SampleProcessor:
    """Builds each image's tar members in the worker; the augmenter is built lazily in each worker."""

    def __init__(self, *, classes: list[str], opts: Any) -> None:
        """``classes``: the class names that label the image files (each file's ``group``);
        ``opts``: the images' options (image checks, augmentation and copies)."""
        self.classes = {name: i for i, name in enumerate(classes)}
        self.labels = {name: str(i).encode() for name, i in self.classes.items()}  # the .cls member of each class
        self.opts = opts
        self.check_images = opts.check_images
        self.max_image_pixels = opts.max_image_pixels
        self.copies = opts.copies
        self._augmenter: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_augmenter": None}

    @property
    def augmenter(self) -> Any:
        """The registered ``augment`` transform for ``--augment`` (None without), built once per process."""
        if self._augmenter is None and self.opts.augment:
            from shardsmith import registry

            self._augmenter = registry.get("transform", "augment").from_spec(self.opts.augment, opts=self.opts)
        return self._augmenter

    def process(self, task: Task, batch: list[tuple[int, Any]]) -> Processed:
        pieces: list[bytes | memoryview] = []
        lengths: list[int] = []
        records: list[int] = []
        bad: list[tuple[int, str]] = []
        for record, (file, data) in batch:
            try:
                samples = self._image(file, data)
            except RecordError as exc:
                bad.append((record, str(exc)))
                continue
            try:
                self._members(samples, pieces, lengths, records, record)
            except ValueError as exc:  # a member name tar cannot hold
                bad.append((record, str(exc)))
        payload = np.frombuffer(b"".join(pieces), dtype=np.uint8)
        return Processed(records=np.asarray(records, dtype=np.int64), lengths=np.asarray(lengths, dtype=np.int64),
                         payload=payload, bad=bad, copies=self.copies)

    # Images that go into the tar unchanged (no augmentation), as ``_image`` makes their samples:
    # the copy mode's workers (``engine.image_copy``, ``image_tar``) ask for keys and labels a shard
    # at a time, and for each extension once its bytes are read.

    def image_keys(self, files: Sequence[InputFile]) -> list[str]:
        return [Identity(f.rel, 0).key() for f in files]

    def image_labels(self, files: Sequence[InputFile]) -> list[bytes]:
        labels = self.labels
        return [labels[f.group] for f in files]

    def image_ext(self, file: InputFile, data: bytes | memoryview) -> str:
        """The member extension of a checked image; a bad one raises DataError. Called once per image: lean."""
        try:
            info = check_image(data, level=self.check_images, max_pixels=self.max_image_pixels)
        except ImageError as exc:
            raise DataError(file=file.rel, reason=str(exc), unit="image", skippable=True) from None
        return canonical_ext(info.format) if info else _suffix_ext(file.path)

    def _members(self, samples: list[tuple[str, list[tuple[str, Any]]]], pieces: list[bytes | memoryview],
                 lengths: list[int], records: list[int], record: int) -> None:
        built = []
        for key, fields in samples:
            if fields and isinstance(fields[0][1], SourceRef):
                ext, ref = fields[0]
                built.append([member_header(f"{key}.{ext}", ref.size), ref.pack(), *sample_members(key, fields[1:])])
            else:
                built.append(sample_members(key, fields))
        for copy, members in enumerate(built):  # all of a record's samples, or none of them
            pieces.extend(members)
            lengths.append(sum(len(m) for m in members))
            records.append(record * self.copies + copy)

    def _image(self, file: InputFile, data: bytes) -> list[tuple[str, list[tuple[str, Any]]]]:
        try:
            info = check_image(data, level=self.check_images, max_pixels=self.max_image_pixels)
        except ImageError as exc:
            raise RecordError(str(exc)) from None
        label = str(self.classes[file.group]).encode()
        ident = Identity(file.rel, 0)
        if self.augmenter is None:
            # zero copy: the tar writer copies the bytes straight from the input file
            ext = canonical_ext(info.format) if info else _suffix_ext(file.path)
            return [(ident.key(), [(ext, SourceRef(index=file.index, size=len(data))), ("cls", label)])]
        out = []
        for copy in range(self.copies):
            try:
                jpeg = self.augmenter.apply(data, identity=file.rel, copy=copy)
            except ImageError as exc:
                raise RecordError(str(exc)) from None
            out.append((ident.key(copy if self.copies > 1 else None), [("jpg", jpeg), ("cls", label)]))
        return out


def _suffix_ext(path: str) -> str:
    ext = Path(path).suffix.lower().lstrip(".")
    return "jpg" if ext == "jpeg" else ext
