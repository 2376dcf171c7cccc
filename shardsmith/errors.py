"""Errors a user can act on: each carries a one-line message, printed by the CLI without a traceback
(and the one warning class, for the same user)."""

from __future__ import annotations


class ShardsmithError(Exception):
    """Base class: a problem with the user's data, options or dataset, not a bug."""

    exit_code = 1


class UsageError(ShardsmithError):
    """Bad options: sizes, splits, missing files named on the command line."""

    exit_code = 2


class ShardsmithWarning(UserWarning):
    """A warning about the user's own call (a mixture whose sources cycle), attributed to the user's
    line (``core/user_warning.py``). A ``UserWarning``, so filters on that category still apply; its own
    class lets a user filter shardsmith's alone, and the command line print it as one line."""


def install_hint(extra: str) -> str:
    """How to install an extra, worded once for every hint: shardsmith is installed from a clone (or a wheel
    or git URL made from one), not from a package index, so ``pip install 'shardsmith[x]'`` would not work."""
    return f"pip install -e '.[{extra}]' in the shardsmith clone (or add [{extra}] to how you installed shardsmith)"


class DataError(ShardsmithError):
    """A bad input record, named by file and record (line for text, row for tables).

    ``skippable``: a bad record that ``--on-error skip`` would have skipped; the message says so.
    """

    def __init__(self, *, file: str, reason: str, record: int | None = None, unit: str = "record",
                 skippable: bool = False) -> None:
        self.file = file
        self.record = record
        self.reason = reason
        self.unit = unit
        self.skippable = skippable
        where = f"{file}" if record is None else f"{file}: {unit} {record + 1}"
        # a reason that already gives its way out (--text-field, then --on-error skip) gets no second hint
        hint = " (pass --on-error skip to skip bad records)" if skippable and "--on-error" not in reason else ""
        super().__init__(f"{where}: {reason}{hint}")

    def __reduce__(self) -> tuple:
        # keyword-only fields: rebuild through a helper so the error crosses process boundaries
        return (_data_error, (self.file, self.reason, self.record, self.unit, self.skippable))


def _data_error(file: str, reason: str, record: int | None, unit: str, skippable: bool = False) -> DataError:
    return DataError(file=file, reason=reason, record=record, unit=unit, skippable=skippable)


class WorkerDied(ShardsmithError):
    """A worker process was killed (out of memory?): the run's finished work is kept for a rerun."""


class DatasetError(ShardsmithError):
    """A dataset folder that is incomplete, corrupt or unsafe to read."""
