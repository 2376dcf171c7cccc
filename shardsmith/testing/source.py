"""The source contract: a source's inputs converted as a user converts them must give the same
bytes for any workers, survive a kill, account for every record, and name a bad record by file
and record number."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any, ClassVar

import pytest

from shardsmith.testing.base import ContractBase
from shardsmith.testing.dataset import check_random_access_equals_iteration
from shardsmith.testing.runs import (
    MANIFEST,
    digest,
    listed_files,
    manifest,
    run,
    run_killed,
    run_ok,
    stable_manifest,
    written,
)


class SourceContract(ContractBase):
    """Subclass in your test suite, name the source and write its inputs::

        class TestCsv(SourceContract):
            source = "csv"
            convert_args = ["--to", "webdataset", "--shard-samples", "20"]

            def make_inputs(self, folder):          # >= 2 files, ~100 records
                ...

            def make_bad_input(self, folder):       # called after make_inputs on the same folder
                (folder / "bad.csv").write_text("a,b\\n1,2\\n3\\n")
                return "bad.csv", 2                 # the file, and the record the error names (row 2)

    ``convert`` runs get ``--from SOURCE`` unless ``convert_args`` names it; a source read by
    ``pack-tokens`` sets ``command = "pack-tokens"`` and its options (``--tokenizer`` in
    ``input_args``, which receives the inputs folder).
    """

    source: ClassVar[str] = ""
    # where the resume test kills a run: a scatter task (needs >= 2 tasks: 2 files give 2) and a
    # gather batch; sources whose files are copied whole (images) have no scatter: "shard:train:1"
    crash_points: ClassVar[tuple[str, ...]] = ("scatter:1", "gather:train:0")

    def make_bad_input(self, folder: Path) -> tuple[str, int | None]:
        """Add or change one file of the inputs (``make_inputs`` wrote them already) so it holds one bad
        record among good ones. Returns the file's path relative to ``folder`` and the record number
        the error must name, as the message shows it (line 4 of a text file: 4), or None for a
        problem of the whole file."""
        raise NotImplementedError(f"{type(self).__name__} must write a bad record in make_bad_input(folder)")

    def base_args(self) -> list[str]:
        args = super().base_args()
        if self.command == "convert" and "--from" not in args:
            args = ["--from", self.source, *args]
        return args

    @pytest.fixture(scope="class")
    @classmethod
    def contract_bad_inputs(cls, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, int | None]:
        """The inputs with one bad record, written once per class."""
        folder = tmp_path_factory.mktemp("contract-bad-inputs")
        contract = cls()
        contract.make_inputs(folder)
        rel, record = contract.make_bad_input(folder)
        assert (folder / rel).is_file(), f"make_bad_input returned {rel!r}, which is not a file of {folder}"
        return folder, rel, record

    def test_holds_a_registered_record_kind(self) -> None:
        """What the source ``holds`` is a registered record kind (``shardsmith.kinds``; a plugin's own
        kind too) whose ``convert`` steps load, and which at least one installed format writes."""
        from shardsmith import registry

        cls = registry.get("source", self.source)
        kind = registry.record_kind(cls.holds, source=self.source)
        assert kind.name == cls.holds, f"the kind registered as {cls.holds!r} calls itself {kind.name!r}"
        kind.steps()  # raises naming the kind if its steps cannot be imported
        writers = [f.name for f in registry.formats() if kind.payload_kind in f.accepts]
        assert writers, f"no installed format accepts {kind.payload_kind!r}, what {cls.holds!r} records are written as"

    def test_resumes_after_a_kill(self, contract_inputs: Path, contract_output: Path, tmp_path: Path) -> None:
        """Killed (SIGKILL) at each of ``crash_points`` in turn, then run again: the bytes of a run never killed."""
        out = tmp_path / "out"
        for point in self.crash_points:
            run_killed(self.command_line(contract_inputs, out), point)
            assert not (out / MANIFEST).exists(), f"a run killed at {point} looks like a finished dataset"
        run_ok(self.command_line(contract_inputs, out, workers=max(self.workers)))
        assert digest(out) == digest(contract_output), "the resumed run wrote other bytes than an uninterrupted one"
        assert stable_manifest(out) == stable_manifest(contract_output)

    def test_manifest_matches_the_files(self, contract_output: Path) -> None:
        """Every file the manifest lists has its size and sha256, every record read is accounted
        for, and ``shardsmith verify`` says OK."""
        m = manifest(contract_output)
        entries = listed_files(m["splits"])
        assert entries, "the manifest lists no shard"
        for entry in entries:
            path = contract_output / entry["path"]
            assert path.is_file(), f"{entry['path']}: listed, missing"
            data = path.read_bytes()
            assert len(data) == entry["bytes"], f"{entry['path']}: {len(data)} bytes, the manifest says {entry['bytes']}"
            assert hashlib.sha256(data).hexdigest() == entry["sha256"], f"{entry['path']}: another sha256"
        src = m["source"]
        if self.command == "convert":
            assert src["reader"] == self.source, f"the manifest names the source {src['reader']!r}"
        assert src["records"] == written(m) + src["skipped"]["count"], f"records lost: {src}"
        res = run(["verify", str(contract_output)])
        assert res.exit_code == 0 and ": OK" in res.output, res.output + res.stderr

    def test_a_bad_record_fails_naming_file_and_record(self, contract_bad_inputs: tuple[Path, str, int | None],
                                                        tmp_path: Path) -> None:
        folder, rel, record = contract_bad_inputs
        out = tmp_path / "out"
        res = run(self.command_line(folder, out))
        err = res.stderr.strip()
        assert res.exit_code == 1, f"exit {res.exit_code} for a bad record (1 expected): {res.stderr}"
        assert "Traceback" not in err and "\n" not in err, f"not one line:\n{res.stderr}"
        assert err.startswith("shardsmith: error: "), err
        assert rel in err, f"the error does not name {rel}: {err}"
        if record is not None:
            assert re.search(rf"{re.escape(rel)}: \w+ {record}\b", err), f"the error does not name record {record}: {err}"
        assert not (out / MANIFEST).exists(), "a failed run looks like a finished dataset"

    def test_a_bad_record_is_skipped_and_counted(self, contract_bad_inputs: tuple[Path, str, int | None],
                                                 tmp_path: Path) -> None:
        folder, rel, record = contract_bad_inputs
        out = tmp_path / "out"
        run_ok(self.command_line(folder, out, extra=("--on-error", "skip")))
        m = manifest(out)
        src = m["source"]
        assert src["records"] == written(m) + src["skipped"]["count"], f"records lost: {src}"
        named: list[dict[str, Any]] = [e for e in [*src["skipped"]["records"], *src.get("unread", [])]
                                       if e.get("file") == rel]
        assert named, f"the manifest lists nothing of {rel} as skipped or unread: {src}"
        if record is not None:
            assert any(e.get("record") == record - 1 for e in named), f"record {record} of {rel} not listed: {named}"

    def test_random_access_equals_iteration(self, contract_output: Path) -> None:
        import shardsmith

        check_random_access_equals_iteration(shardsmith.open(contract_output, split=self.split))
