"""Conformance tests for plugins: the contracts a source, a format (writer) and its dataset keep.

A plugin author subclasses a contract in their own test suite, names the plugin, writes small
inputs, and inherits the tests (as fsspec's ``fsspec.tests.abstract`` does for file systems)::

    # tests/test_contract.py of the package shardsmith-csv
    from shardsmith.testing import SourceContract

    class TestCsvSource(SourceContract):
        source = "csv"
        convert_args = ["--to", "webdataset", "--shard-samples", "20"]

        def make_inputs(self, folder):
            for name, rows in (("a.csv", range(60)), ("b.csv", range(60, 110))):
                (folder / name).write_text("id,text\\n" + "".join(f"{i},row {i}\\n" for i in rows))

        def make_bad_input(self, folder):
            (folder / "c.csv").write_text("id,text\\n1,one\\n2\\n")
            return "c.csv", 2  # the file, and the record the error must name (its second row)

Run it with pytest as any test; the plugin must be installed (its entry point registered), as a
user would have it. Every command runs as a user runs it: through the command line, in this
process, or, for the kill tests, in a child process that ``SHARDSMITH_CRASH_AT`` kills.

- ``SourceContract``: the kind it holds is registered (a plugin's own kind too) and written by a
  format; the same bytes for any ``--workers``; a run killed during reading and during
  writing resumes to the bytes of a run never killed; the manifest's sizes and sha256 are the
  files' and ``verify`` says OK; a bad record is one error line naming file and record (exit 1),
  and ``--on-error skip`` lists and counts it; random access equals iteration.
- ``FormatContract``: the same bytes for any ``--workers``; ``verify`` and ``verify --deep`` pass
  and a flipped byte fails ``verify`` naming the file; a format of events gives an encoder whose
  records each depend on their event alone (``shardsmith.testing.events``); and ``DatasetContract``.
- ``DatasetContract``: ``ds[i]`` equals iteration in order and ``get_batch``; a manifest naming a
  shard outside the folder is a DatasetError; the dataset pickles (for DataLoader workers).

This package imports pytest; shardsmith never imports it at run time.
"""

from shardsmith.testing.base import ContractBase
from shardsmith.testing.dataset import DatasetContract, batch_items, same
from shardsmith.testing.format import FormatContract
from shardsmith.testing.runs import digest, run, run_killed, run_ok, stable_manifest
from shardsmith.testing.source import SourceContract

__all__ = ["ContractBase", "DatasetContract", "FormatContract", "SourceContract", "batch_items", "digest", "run",
           "run_killed", "run_ok", "same", "stable_manifest"]
