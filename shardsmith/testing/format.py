"""The format contract: the writer's shards are the same for any workers and verifiable (a
flipped byte is found and named), every file it writes is its own and listed, a killed run resumes
to the same bytes, and its dataset keeps the dataset contract."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import ClassVar

import pytest

from shardsmith.testing.base import ContractBase
from shardsmith.testing.dataset import DatasetContract
from shardsmith.testing.runs import CARD, MANIFEST, digest, manifest, run, run_killed, run_ok


class FormatContract(ContractBase, DatasetContract):
    """Subclass in your test suite, name the format and write inputs of a kind it holds::

        class TestNpz(FormatContract):
            format = "npz"                                  # its registry name
            convert_args = ["--shard-samples", "20"]        # --to is added from the format's option

            def make_inputs(self, folder):                  # ~100 records, >= 3 shards of them
                ...

    A format written by its own command (``option`` None, or a job of its own as ``tokens``:
    ``pack-tokens``) sets ``command`` and its options. Set ``picklable = False`` for a dataset never sent to DataLoader
    workers, and override ``open_dataset`` or ``batch_items`` for a dataset read another way.
    """

    format: ClassVar[str] = ""

    def base_args(self) -> list[str]:
        args = super().base_args()
        if self.command == "convert" and "--to" not in args:
            from shardsmith import registry

            option = registry.format_named(self.format).option
            assert option, f"format {self.format!r} is not written by convert --to: set command"
            args = ["--to", option, *args]
        return args

    def test_read_by_this_format(self, contract_output: Path) -> None:
        from shardsmith import registry

        found = registry.format_of(manifest(contract_output))
        assert found.name == self.format, f"the dataset is read by format {found.name!r}, not {self.format!r}"

    def test_verify_and_verify_deep_pass(self, contract_output: Path) -> None:
        for deep in ([], ["--deep"]):
            res = run(["verify", str(contract_output), *deep])
            assert res.exit_code == 0 and ": OK" in res.output, f"verify {' '.join(deep)}: {res.output}{res.stderr}"

    def test_a_flipped_byte_fails_verify_naming_the_file(self, contract_output: Path, tmp_path: Path) -> None:
        out = tmp_path / "dataset"
        shutil.copytree(contract_output, out)
        m = manifest(out)
        assert len(m["splits"][self.split]["shards"]) >= 2, "make inputs for several shards"
        rel = m["splits"][self.split]["shards"][-1]["path"]
        data = bytearray((out / rel).read_bytes())
        assert data, f"{rel} is empty"
        data[len(data) // 2] ^= 0x01
        (out / rel).write_bytes(bytes(data))
        res = run(["verify", str(out)])
        assert res.exit_code == 1, f"verify passed a shard with a flipped byte: {res.output}"
        assert f"FAIL {rel}" in res.output, f"verify does not name {rel}: {res.output}"
        assert (out / MANIFEST).is_file()

    def test_every_file_written_is_the_formats_own_and_listed(self, contract_output: Path) -> None:
        """Every file the run left is one the format declares (``Format.own_files``: what
        ``--overwrite`` removes and an output in object storage publishes), and every one but the
        manifest and the card is listed in the manifest (a shard, a shard's companion, a split-wide
        file), so ``verify`` checks it."""
        from shardsmith import registry
        from shardsmith.core.own_files import EVERY_OUTPUT
        from shardsmith.kit.format import manifest_files

        fmt = registry.format_named(self.format)
        own = fmt.own_files | EVERY_OUTPUT
        written = {p.relative_to(contract_output).as_posix() for p in contract_output.rglob("*") if p.is_file()}
        undeclared = sorted(rel for rel in written if not own.owns(rel))
        assert not undeclared, f"files the format does not declare in own_files (--overwrite leaves them): {undeclared}"
        listed = {e["path"] for e in manifest_files(manifest(contract_output), fmt)}
        assert written - {MANIFEST, CARD} == listed, (f"written, not listed: {sorted(written - {MANIFEST, CARD} - listed)}; "
                                                      f"listed, not written: {sorted(listed - written)}")

    def test_its_event_records_depend_on_each_event_alone(self, contract_output: Path) -> None:
        """A format of events: the encoder it gives the workers (``Format.encoder``; the neutral one
        by default), made from the dataset's own schema and options, makes one record per event
        from that event alone, in any order, in pieces or joined, after a pickle
        (``shardsmith.testing.events``)."""
        from shardsmith import registry
        from shardsmith.testing.events import check_event_records

        fmt = registry.format_named(self.format)
        if "events" not in fmt.accepts:
            pytest.skip(f"{self.format} holds no events")
        check_event_records(fmt, manifest(contract_output))

    def test_resumes_after_a_kill_in_the_gather(self, contract_inputs: Path, contract_output: Path,
                                                tmp_path: Path) -> None:
        """Killed (SIGKILL) while its writers write the shards, then run again: the bytes of a run
        never killed (what the killed run left is the format's own, and taken over)."""
        out = tmp_path / "out"
        run_killed(self.command_line(contract_inputs, out), f"gather:{self.split}:0")
        assert not (out / MANIFEST).exists(), "a run killed in the gather looks like a finished dataset"
        run_ok(self.command_line(contract_inputs, out))
        assert digest(out) == digest(contract_output), "the resumed run wrote other bytes than an uninterrupted one"
