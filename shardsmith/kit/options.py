"""The options a format declares for ``convert --to`` (docs/design.md, "Plugins").

A format lists its options (name, type, range or choices, default, help) in a light module that
imports nothing but this one, so ``convert --help`` shows them, and ``convert`` refuses them with
another ``--to``, without importing the format, numpy or the format's libraries. Its writers then
get the values as ``job.options`` (``OptionValues``), typed and with the defaults filled in: never
the command's whole record. Only the standard library and ``shardsmith.errors`` are imported here.

The declaration: ``options = FormatOptions(to=..., options=(Option(name=, type=int|float|str|flag|size,
default=, help=, low=/high= or choices=, metavar=), ...))``, in the built-ins' ``formats/NAME/options.py``;
a plugin names its module in the ``shardsmith.format_options`` entry-point group, under the format's
name, and its package's ``__init__`` stays light too. ``convert --help`` shows them under "Options for
--to NAME" and refuses one given a value with another ``--to`` (one line, exit 2). The manifest
records the values (``format_options``) and the run's identity digests them; ``WriteJob.opts`` still
holds the run's options. Formats may share a declaration (the shard sizes, ``SHARD_SIZE``: one flag).
A format with ``options = None`` (written before formats declared options) is given the options every
``--to`` took then (``registry.LEGACY_OPTIONS``) and reads them as ``job.opts.NAME``, with a
DeprecationWarning naming ``job.options.NAME``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from shardsmith.errors import UsageError

# The ranges of numeric options: past them a value is a typo, and would overflow what is made of it
MAX_COUNT = (1 << 62) - 1  # records, samples: 64-bit sums stay exact
MAX_INT32 = (1 << 31) - 1  # lengths stored as int32

TYPES = ("int", "float", "str", "flag", "size")  # "size": bytes, given as 256MB, 2GiB or a number


@dataclass(frozen=True, kw_only=True)
class Option:
    """One option of a format: ``name`` is the attribute of ``job.options`` and, with dashes, the
    flag (``max_len``: ``--max-len``). ``low``/``high`` bound an int or float; ``choices`` the values
    of a str; a ``size`` default is text as the user writes it (``"256MB"``)."""

    name: str
    type: str = "str"
    default: Any = None
    help: str = ""
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()
    metavar: str | None = None

    def __post_init__(self) -> None:
        if not self.name.isidentifier() or self.name.startswith("_"):
            raise ValueError(f"option name {self.name!r} must be a Python identifier (not starting with _)")
        if self.type not in TYPES:
            raise ValueError(f"option {self.name!r}: type {self.type!r} is not one of {', '.join(TYPES)}")
        if self.choices and self.type != "str":
            raise ValueError(f"option {self.name!r}: choices are for type 'str'")
        if self.type == "flag" and self.default not in (False, None):
            raise ValueError(f"option {self.name!r}: a flag is off by default")

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def value(self, given: Any) -> Any:
        """``given`` as the writer gets it (a size in bytes, a flag as a bool), checked against the
        declaration: a UsageError in the command line's words when it is not one of its values."""
        if given is None:
            if self.type == "flag":
                return False
            if self.default is None:
                return None
            given = self.default
        if self.type == "size":
            from shardsmith.core.sizes import parse_size

            return parse_size(given, option=self.flag)
        if self.type == "flag":
            if not isinstance(given, bool):
                raise UsageError(f"{self.flag} is a flag (true or false), not {given!r}")
            return given
        kinds: tuple[type, ...] = {"int": (int,), "float": (int, float), "str": (str,)}[self.type]
        if not isinstance(given, kinds) or isinstance(given, bool):
            raise UsageError(f"{self.flag}: {given!r} is not {'an' if self.type == 'int' else 'a'} {self.type}")
        if self.choices and given not in self.choices:
            raise UsageError(f"{self.flag}: {given!r} is not one of {', '.join(self.choices)}")
        if (self.low is not None and given < self.low) or (self.high is not None and given > self.high):
            raise UsageError(f"{self.flag}: {given!r} is not in the range {self.low}..{self.high}")
        return float(given) if self.type == "float" else given

    def default_value(self) -> Any:
        """The value the writer gets when the option is not given."""
        return self.value(None)


@dataclass(frozen=True, kw_only=True)
class FormatOptions:
    """What a format declares: the ``convert --to`` value that picks it (None: a format only its own
    command writes) and its options.

    ``command``: a built-in command whose job writes this format (``pack-tokens`` for ``tokens``):
    ``convert --to`` builds that command's job from its options (``commands/convert.job_of``), one
    code path and the same bytes, rather than convert's steps. ``recorded``: whether the manifest
    records the values as ``format_options`` (``engine/finish.py``); False where the format's own
    ``manifest_fields`` record them (``tokens``: ``seq_len``, ``packing``, ``nanogpt``, as its
    manifests held them before formats declared options), so that no value is written twice."""

    to: str | None
    options: tuple[Option, ...] = ()
    command: str | None = None
    recorded: bool = True

    def __post_init__(self) -> None:
        names = [o.name for o in self.options]
        if len(set(names)) != len(names):
            raise ValueError(f"--to {self.to}: an option is declared twice ({', '.join(names)})")

    def names(self) -> tuple[str, ...]:
        return tuple(o.name for o in self.options)

    def values(self, given: Mapping[str, Any]) -> OptionValues:
        """This format's values: ``given`` (by name; those of other formats are not looked at),
        checked, with the defaults filled in."""
        return OptionValues(values={o.name: o.value(given.get(o.name)) for o in self.options})


class OptionValues:
    """A format's option values, read as attributes (``job.options.max_len``); frozen, picklable."""

    __slots__ = ("_values",)

    def __init__(self, *, values: Mapping[str, Any] | None = None) -> None:
        object.__setattr__(self, "_values", dict(values or {}))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        try:
            return self._values[name]
        except KeyError:
            declared = ", ".join(self._values) or "none"
            raise AttributeError(f"no format option {name!r} (declared: {declared})") from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("format options are read-only")

    def __reduce__(self) -> tuple[Any, ...]:
        return (_values_of, (self._values,))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OptionValues) and self._values == other._values

    def __hash__(self) -> int:
        return hash(tuple(sorted(self._values.items(), key=lambda kv: kv[0])))

    def __repr__(self) -> str:
        return f"OptionValues({', '.join(f'{k}={v!r}' for k, v in self._values.items())})"

    def __bool__(self) -> bool:
        return bool(self._values)

    def as_dict(self) -> dict[str, Any]:
        """The values by name (what the manifest's ``format_options`` records)."""
        return dict(self._values)


def _values_of(values: dict[str, Any]) -> OptionValues:
    return OptionValues(values=values)


def refusal(name: str, value: Any, *, to: str, declared: Iterable[FormatOptions]) -> str | None:
    """Why option ``name``, given ``value``, cannot go with ``--to TO`` (one line), or None when it
    can: a format of that ``--to`` declares it, or the value is its default (an option left alone).
    ``declared``: every format's declaration."""
    declared = list(declared)
    owners = [d for d in declared if name in d.names()]
    if not owners or any(d.to == to for d in owners):
        return None
    option = next(o for o in owners[0].options if o.name == name)
    if value == option.default_value():
        return None
    tos = sorted({d.to for d in owners})
    return f"{option.flag} applies to --to {', '.join(tos)} only, not to --to {to}"


# Shard sizing, declared by every format whose writer rolls over to a new shard (``kit/rollover.py``):
# formats that declare the same option share its flag (the declarations must be equal)
SHARD_SAMPLES = Option(name="shard_samples", type="int", low=1, high=MAX_COUNT, help="Roll over after this many samples.")
SHARD_BYTES = Option(name="shard_bytes", type="size", default="256MB", help="Roll over before a shard grows past this size.")
SHARD_SIZE = (SHARD_SAMPLES, SHARD_BYTES)
