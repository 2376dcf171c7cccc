"""Image files into samples in the worker: each checked (``--check-images``), augmented into
``--copies`` JPEGs or left as it is, and made a neutral ``Sample`` that the chosen format encodes
(``Format.encoder``: webdataset's tar members). The sample's fields: ``image`` (the bytes; an
unchanged file's as ``FileBytes``, which an encoder may reference instead of carrying), ``ext``
(its canonical file extension: ``jpg``, ``png``...) and ``cls`` (the class's position in ``classes``).

The engine's copy mode (``engine/copying/image_copy.py``) takes keys, labels and extensions from here too,
a shard's worth at a time (``kit.file_copy.ImageSamples``), without a sample per file."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from shardsmith.core.images import ImageError, canonical_ext, check_image
from shardsmith.core.input_file import InputFile
from shardsmith.core.sample import Identity
from shardsmith.errors import DataError
from shardsmith.kit.processed import Processed
from shardsmith.kit.sample import FileBytes, RecordError, Sample, SampleEncoder


class ImageProcessor:
    """An image file its samples (``copies`` of them when augmented); the augmenter is built lazily in each worker."""

    def __init__(self, *, classes: list[str], opts: Any, encoder: SampleEncoder) -> None:
        """``classes``: the class names that label the image files (each file's ``group``);
        ``opts``: the images' options (image checks, augmentation and copies); ``encoder``: the format's."""
        self.classes = {name: i for i, name in enumerate(classes)}
        self.labels = {name: str(i).encode() for name, i in self.classes.items()}  # each class's label, as text
        self.opts = opts
        self.check_images = opts.check_images
        self.max_image_pixels = opts.max_image_pixels
        self.copies = opts.copies
        self.encoder = encoder
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

    def process(self, task: Any, batch: list[tuple[int, Any]]) -> Processed:
        pieces: list[Any] = []
        lengths: list[int] = []
        records: list[int] = []
        bad: list[tuple[int, str]] = []
        encode = self.encoder.encode
        for record, (file, data) in batch:
            try:
                encoded = [encode(s) for s in self.samples(file, data)]  # all of them, or none
            except (RecordError, ValueError) as exc:  # (ValueError: a name the format cannot hold)
                bad.append((record, str(exc)))
                continue
            for copy, parts in enumerate(encoded):
                pieces.extend(parts)
                lengths.append(sum(len(p) for p in parts))
                records.append(record * self.copies + copy)
        payload = np.frombuffer(b"".join(pieces), dtype=np.uint8)
        return Processed(records=np.asarray(records, dtype=np.int64), lengths=np.asarray(lengths, dtype=np.int64),
                         payload=payload, bad=bad, copies=self.copies)

    def samples(self, file: InputFile, data: bytes) -> list[Sample]:
        """The samples of one image file (RecordError: a bad image)."""
        try:
            info = check_image(data, level=self.check_images, max_pixels=self.max_image_pixels)
        except ImageError as exc:
            raise RecordError(str(exc)) from None
        label = self.classes[file.group]
        ident = Identity(file.rel, 0)
        if self.augmenter is None:
            ext = canonical_ext(info.format) if info else _suffix_ext(file.path)
            return [Sample(ident.key(), {"image": FileBytes(data, file.index), "ext": ext, "cls": label})]
        out = []
        for copy in range(self.copies):
            try:
                jpeg = self.augmenter.apply(data, identity=file.rel, copy=copy)
            except ImageError as exc:
                raise RecordError(str(exc)) from None
            out.append(Sample(key=ident.key(copy if self.copies > 1 else None),
                              fields={"image": jpeg, "ext": "jpg", "cls": label}))
        return out

    # The copy mode's workers (``engine.copying.image_copy``; the format's ``file_copier``) ask for keys and
    # labels a shard at a time, and for each extension once its bytes are read: as ``samples`` makes them.

    def image_keys(self, files: Sequence[InputFile]) -> list[str]:
        return [Identity(f.rel, 0).key() for f in files]

    def image_labels(self, files: Sequence[InputFile]) -> list[bytes]:
        labels = self.labels
        return [labels[f.group] for f in files]

    def image_ext(self, file: InputFile, data: bytes | memoryview) -> str:
        """The extension of a checked image; a bad one raises DataError. Called once per image: lean."""
        try:
            info = check_image(data, level=self.check_images, max_pixels=self.max_image_pixels)
        except ImageError as exc:
            raise DataError(file=file.rel, reason=str(exc), unit="image", skippable=True) from None
        return canonical_ext(info.format) if info else _suffix_ext(file.path)


def _suffix_ext(path: str) -> str:
    ext = Path(path).suffix.lower().lstrip(".")
    return "jpg" if ext == "jpeg" else ext
