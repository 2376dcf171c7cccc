"""Image folders in the torchvision convention: class = subfolder, classes sorted by name, label = position.

Each image file is one record (number 0 of its own path); a task is a run of files, so workers
take thousands of small files at a time.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from shardsmith.core.file_listing import groups_of
from shardsmith.core.input_file import InputFile
from shardsmith.errors import UsageError
from shardsmith.kit.reader import BadRecord, Reader, Task

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp")
MAX_FILES_PER_TASK = 2048


class ImageFolderReader(Reader):
    name = "imagefolder"
    suffixes = IMAGE_SUFFIXES
    unit = "image"
    holds = "images"

    def sample_schema(self, opts: Any) -> dict[str, Any]:
        return {"image": {"kind": "image", "ext": "jpg" if opts.augment else "as stored"},
                "cls": {"kind": "int", "dtype": "int64"}}

    def classes(self, files: Sequence[InputFile]) -> list[str]:
        """Class names, sorted; every image must sit in a class subfolder of an input folder."""
        groups = groups_of(files)
        if "" in groups:
            loose = next(f.rel for f in files if not f.group)
            raise UsageError(f"{loose}: an image folder holds images in class subfolders (root/CLASS/img.jpg); "
                             f"this one is directly in the input folder")
        return sorted(groups)

    def reads_to_check(self, file: InputFile) -> bool:
        return False  # classes come from the listing

    def reads_to_plan(self, file: InputFile, *, chunk_bytes: int) -> bool:
        return False  # tasks too

    def plan(self, files: list[InputFile], *, chunk_bytes: int) -> list[Task]:
        tasks: list[Task] = []
        run: list[InputFile] = []
        size = 0
        for f in files:
            run.append(f)
            size += f.size
            if size >= chunk_bytes or len(run) >= MAX_FILES_PER_TASK:
                tasks.append(Task(index=len(tasks), file=run[0], nbytes=size, files=tuple(run)))
                run, size = [], 0
        if run:
            tasks.append(Task(index=len(tasks), file=run[0], nbytes=size, files=tuple(run)))
        return tasks

    def read(self, task: Task) -> Iterator[tuple[int, Any]]:
        """``(position in task, (file, bytes))``; an unreadable file is a bad record, not the end."""
        for i, f in enumerate(task.files):
            try:
                with open(f.path, "rb") as fh:
                    data = fh.read()
            except OSError as exc:
                yield i, BadRecord(f"cannot read: {exc.strerror or exc}")
                continue
            yield i, (f, data)

    def identities(self, task: Task, records: np.ndarray) -> tuple[list[str], np.ndarray, np.ndarray]:
        files = [task.files[int(i)] for i in records]
        return ([f.rel for f in files], np.zeros(len(files), dtype=np.int64),
                np.fromiter((f.index for f in files), dtype=np.int64, count=len(files)))

    def describe(self, task: Task, record: int) -> tuple[str, int | None]:
        """(file, record number) of a record for messages: the image's own path."""
        return task.files[record].rel, None
