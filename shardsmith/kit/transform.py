"""The transform protocol: a change made once, offline, to each record in the worker, before the
record becomes a sample (docs/design.md, "Plugins").

A transform is a class registered under a name (``shardsmith.registry``; plugins through the
``shardsmith.transforms`` entry-point group). ``convert --augment SPEC`` runs the built-in image
transform ``augment``; ``convert --transform NAME[=SPEC]`` and ``pack-tokens --transform ...``
run any registered transform that applies to the source's records. Contract:

- ``from_spec(spec, opts=...)`` builds it from the text after ``=`` (or None) and the command's
  options (``seed``, ``quality``...); a bad spec is a UsageError, raised before any work;
- ``apply(value, identity=..., copy=...)`` returns the new record. Its result depends only on the
  spec, the options, the record and its identity (a stable name of the record: its file and
  number) and ``copy`` -- never on time, workers or order -- so the output bytes stay the same for
  any ``--workers``. A record it cannot transform raises ``RecordError`` (a bad record: skipped
  and counted with ``--on-error skip``);
- it pickles (spawned workers receive it) and ``describe()`` is JSON the manifest records;
- ``inputs()``: the files it reads (a tokenizer), hashed into the run's identity
  (``engine/output/resume.py``): a rerun after one changed starts over instead of resuming;
- ``fields_after(schema)``: the fields it adds or changes, for the manifest's ``schema``;
- ``samples``: whether ``prepare(records)`` is to see the input's first records (after the
  transforms before it), once a run, before the workers get it: what they tell may decide how,
  never what, it makes (a tokenizer's engine, checked on their text). It returns the decision as
  JSON, which ``prepared`` takes: the later processes of a staged run take the first one's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, ClassVar

from shardsmith.kit.sample import RecordError


class Transform:
    """Base class of transforms; the module docstring has the contract."""

    name: ClassVar[str] = ""
    applies_to: ClassVar[tuple[str, ...]] = ("rows",)  # record kinds: "rows" (dicts), "images" (bytes)
    random: bool = False  # whether copies of a record differ (``--copies`` needs a random transform)
    samples: ClassVar[bool] = False  # whether ``prepare`` is to see the input's first records

    @classmethod
    def from_spec(cls, spec: str | None, *, opts: Any) -> Transform:
        return cls()

    def apply(self, value: Any, *, identity: str, copy: int) -> Any:
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        return {"transform": self.name}

    def inputs(self) -> tuple[str, ...]:
        """The files besides the inputs its records depend on (none by default)."""
        return ()

    def fields_after(self, schema: dict[str, Any]) -> dict[str, Any]:
        """The description of the records' fields after it (``Reader.sample_schema``'s, then each
        transform's in turn: what the manifest's ``schema`` names): unchanged by default."""
        return schema

    def prepare(self, records: Iterator[Any]) -> Any:
        """What the input's first records decide (``samples``), as JSON; it takes as many as it needs."""
        return None

    def prepared(self, decision: Any) -> None:
        """Take what ``prepare`` decided (in this process, or an earlier one of a staged run)."""


def parse_transform(text: str) -> tuple[str, str | None]:
    """``NAME=SPEC`` or ``NAME`` as given to ``--transform``."""
    name, eq, spec = text.partition("=")
    return name.strip(), (spec if eq else None)


def build_transforms(texts: tuple[str, ...], *, holds: str, opts: Any) -> list[Transform]:
    """The ``--transform`` options as transform objects, checked against the records they get."""
    from shardsmith import registry
    from shardsmith.errors import UsageError

    out = []
    for text in texts:
        name, spec = parse_transform(text)
        cls = registry.get("transform", name)
        if holds not in cls.applies_to:
            raise UsageError(f"--transform {name}: it applies to {', '.join(cls.applies_to)}, and these inputs "
                             f"hold {holds}")
        out.append(cls.from_spec(spec, opts=opts))
    return out


def apply_all(transforms: list[Transform], value: Any, *, file: str, record: int) -> Any:
    """A record through the transforms in order; its identity is ``FILE#RECORD`` (relative path and
    record number), the same for any task plan, worker or rank."""
    identity = f"{file}#{record}"
    for t in transforms:
        value = t.apply(value, identity=identity, copy=0)
    return value


def transform_inputs(transforms: list[Transform]) -> tuple[str, ...]:
    """The files the transforms read (``Transform.inputs``), for the run's identity."""
    return tuple(path for t in transforms for path in t.inputs())


def prepare_all(transforms: list[Transform], records: Callable[[], Iterator[tuple[str, int, Any]]]) -> list[Any]:
    """What each transform that asks (``samples``) decides on the input's first good records, as
    ``(file, record, value)`` from ``records()`` (read again for each), through the transforms before
    it (a record one of them refuses left out); None for the others."""
    return [t.prepare(_through(transforms[:k], records())) if t.samples else None for k, t in enumerate(transforms)]


def _through(transforms: list[Transform], records: Iterator[tuple[str, int, Any]]) -> Iterator[Any]:
    for file, record, value in records:
        try:
            yield apply_all(transforms, value, file=file, record=record)
        except RecordError:
            continue
