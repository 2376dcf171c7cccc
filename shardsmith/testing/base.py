"""What every contract shares: the command line the subclass describes, its inputs built once per
class, the dataset one run (``--workers 1``) makes of them, and the test that workers never change
the bytes."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import pytest

from shardsmith.testing.runs import digest, run_ok, stable_manifest, written


class ContractBase:
    """Fixtures and the command line; ``SourceContract`` and ``FormatContract`` add the tests.

    A subclass sets ``command`` (``"convert"`` or ``"pack-tokens"``) and ``convert_args`` (options
    every run gets: ``--to``, shard sizes, ``--tokenizer``...), writes its inputs in ``make_inputs``
    and, if the inputs are not one folder (an events table, a tokenizer beside them), says how they
    are named on the command line in ``input_args``. Keep inputs small (about 100 records in at
    least 2 files) and shards small (3 or more), so every run takes a fraction of a second.
    """

    command: ClassVar[str] = "convert"
    convert_args: ClassVar[list[str]] = []
    split: ClassVar[str] = "train"  # the split the dataset tests read
    workers: ClassVar[tuple[int, ...]] = (1, 2, 3)  # the first makes the reference dataset

    def make_inputs(self, folder: Path) -> None:
        """Write the inputs into ``folder`` (it exists and is empty)."""
        raise NotImplementedError(f"{type(self).__name__} must write its inputs in make_inputs(folder)")

    def input_args(self, folder: Path) -> list[str]:
        """The inputs as the command line names them: the folder itself by default."""
        return [str(folder)]

    def base_args(self) -> list[str]:
        """The options every run gets (the contracts add ``--from`` or ``--to`` where they are missing)."""
        return [str(a) for a in self.convert_args]

    def command_line(self, inputs: Path, out: Path, *, workers: int = 1, extra: tuple[str, ...] = ()) -> list[str]:
        return [self.command, *self.input_args(inputs), *self.base_args(), *extra, "-o", str(out),
                "--workers", str(workers), "-q"]

    @pytest.fixture(scope="class")
    @classmethod
    def contract_inputs(cls, tmp_path_factory: pytest.TempPathFactory) -> Path:
        """The inputs, written once per class."""
        folder = tmp_path_factory.mktemp("contract-inputs")
        cls().make_inputs(folder)
        return folder

    @pytest.fixture(scope="class")
    @classmethod
    def contract_output(cls, contract_inputs: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
        """The reference dataset: the command with the first of ``workers``."""
        out = tmp_path_factory.mktemp("contract-output") / "out"
        run_ok(cls().command_line(contract_inputs, out, workers=cls.workers[0]))
        return out

    def test_same_bytes_for_any_workers(self, contract_inputs: Path, contract_output: Path, tmp_path: Path) -> None:
        """Guarantee 2: the same command gives the same files, byte for byte, whatever ``--workers``."""
        reference = digest(contract_output)
        assert written(stable_manifest(contract_output)) > 0, "the inputs made an empty dataset"
        for w in self.workers[1:]:
            out = tmp_path / f"workers-{w}"
            run_ok(self.command_line(contract_inputs, out, workers=w))
            assert digest(out) == reference, f"--workers {w} wrote other bytes than --workers {self.workers[0]}"
            assert stable_manifest(out) == stable_manifest(contract_output), f"--workers {w}: another manifest"
