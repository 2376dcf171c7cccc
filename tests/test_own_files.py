"""A format owns its files (issue 45, item 3): which files and folders an output holds, which files go
with a shard and when a piece a killed run left is finished are declared by the format and its writer
(``Format.own_files``, the shard record's companions, the piece's ``files`` and ``stretches``), and
``--overwrite``, a rerun, ``verify``, the dataset card and an output in object storage go by that.

The proof is a format written as a folder per shard (``tests/folder_format.py``): the shape of Lance
or MDS outputs, which no layer below the formats knows by name.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import make_docs, run_cli, tree_digest, write_jsonl
from folder_format import LENGTHS, SAMPLES, registered

from shardsmith import registry
from shardsmith.core.own_files import EVERY_OUTPUT, Folder, OwnFiles
from shardsmith.testing import FormatContract
from shardsmith.testing.runs import run_killed


@pytest.fixture(autouse=True)
def folder_plugin() -> Iterator[None]:
    with registered():
        yield


@pytest.fixture(scope="module")
def rows(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Rows in two JSONL files: two scatter tasks, five shards of 20 at ``--shard-samples 20``."""
    folder = tmp_path_factory.mktemp("rows")
    docs = make_docs(100, seed=11, max_words=12)
    write_jsonl(folder / "a.jsonl", docs[:60])
    write_jsonl(folder / "b.jsonl", docs[60:])
    return folder


def _convert(rows: Path, out: Path | str, *extra: str, to: str = "folders", shards: int = 20,
             quiet: bool = True) -> list[str]:
    return ["convert", str(rows), "-o", str(out), "--to", to, "--shard-samples", str(shards), *extra,
            *(["-q"] if quiet else [])]


def _ok(args: list[str]) -> None:
    res = run_cli(*args)
    assert res.exit_code == 0, res.stderr


# -- the declarations ---------------------------------------------------------------------------------

def test_patterns_match_one_segment_at_a_time_and_a_temporary_folder_is_its_folders():
    own = OwnFiles(files=("*.bin",), folders=(Folder("__index__", holds=("*.npy",)), Folder("*.lance")))
    assert own.owns("train.bin") and not own.owns("sub/train.bin") and not own.owns("notes.txt")
    assert own.owns("__index__/a.npy") and not own.owns("__index__/deeper/a.npy") and not own.owns("__index__/a.txt")
    assert own.owns("ds.lance/data/0.lance") and own.owns("ds.lance/_versions/1.manifest")
    assert own.owns(".train.bin.tmp-host-12") and own.owns("__index__/.a.npy.tmp-host-12")
    assert own.owns(".ds.lance.tmp-host-12/data/0.lance"), "a folder built before it is renamed into place"
    assert not own.owns(".notes.tmp-host-1/x") and not own.owns("other/x.npy")
    joined = own | OwnFiles(folders=(Folder("__index__", holds=("*.json",)),))
    assert joined.owns("__index__/a.json") and joined.owns("__index__/a.npy")


def test_the_registry_joins_every_format_with_what_every_run_leaves():
    own = registry.own_files()
    for name in ("manifest.json", ".shardsmith-run.json", "README.md", "train-000000.tar", "train.bin",
                 "tokenizer.json", "meta.pkl", "train.memmap.json", "__index__/train.wids.json",
                 "train-000003.dir/samples.bin", "train-000003.dir/any/depth"):
        assert own.owns(name), name
    assert not own.owns("notes.txt") and not own.owns("data/train-000000.tar")
    assert set(EVERY_OUTPUT.files) <= set(own.files)


# -- a format written as folders, end to end ----------------------------------------------------------

def test_a_folder_per_shard_is_listed_verified_and_carded_file_by_file(rows, tmp_path):
    out = tmp_path / "out"
    _ok(_convert(rows, out, "--split", "train=0.8,val=0.2"))
    m = json.loads((out / "manifest.json").read_text())
    shards = m["splits"]["train"]["shards"]
    assert [s["path"] for s in shards] == [f"train-{i:06d}.dir/{SAMPLES}" for i in range(len(shards))]
    assert shards[0]["lengths"]["path"] == f"train-000000.dir/{LENGTHS}"
    written = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    listed = {e["path"] for split in m["splits"].values() for s in split["shards"] for e in (s, s["lengths"])}
    assert written == listed | {"manifest.json", "README.md"}, "a file no record names, or a record of no file"
    card = (out / "README.md").read_text()
    assert f"| train-000001.dir/{LENGTHS} | {shards[1]['lengths']['bytes']} |" in card
    for args in ([], ["--deep"]):
        res = run_cli("verify", out, *args)
        assert res.exit_code == 0 and f"OK: {2 * (len(shards) + len(m['splits']['val']['shards']))} files" \
            in res.output, res.output
    # a shard's companion is checked like the shard
    (out / "train-000001.dir" / LENGTHS).write_text('{"lengths": []}')
    res = run_cli("verify", out)
    assert res.exit_code == 1 and f"FAIL train-000001.dir/{LENGTHS}: " in res.output, res.output


def test_overwrite_replaces_folders_and_other_formats_but_never_a_users_file(rows, tmp_path):
    out = tmp_path / "out"
    _ok(_convert(rows, out))
    assert len(list(out.glob("train-*.dir"))) == 5
    _ok(_convert(rows, out, "--overwrite", shards=50))  # two shards now: three folders go
    assert sorted(p.name for p in out.glob("train-*.dir")) == ["train-000000.dir", "train-000001.dir"]
    _ok(_convert(rows, out, "--overwrite", to="webdataset"))  # another format's dataset replaces it
    assert not list(out.glob("*.dir")) and (out / "__index__").is_dir()
    _ok(_convert(rows, out, "--overwrite"))
    assert not list(out.glob("*.tar")) and not (out / "__index__").exists()
    assert run_cli("verify", out).exit_code == 0
    (out / "notes").mkdir()
    (out / "notes" / "mine.txt").write_text("mine\n")
    res = run_cli(*_convert(rows, out, "--overwrite", shards=30))
    assert res.exit_code == 2 and "only shardsmith's own files; also found ['notes']" in res.stderr, res.stderr
    assert "nothing was removed" in res.stderr, res.stderr
    assert (out / "notes" / "mine.txt").read_text() == "mine\n"
    assert run_cli("verify", out).exit_code == 0  # refused before anything went: the old dataset is whole


@pytest.mark.parametrize("point", ["gather:train:0", "manifest"])
def test_a_killed_run_resumes_to_the_same_bytes(rows, tmp_path, point):
    reference = tmp_path / "ref"
    _ok(_convert(rows, reference, "--workers", "2"))
    out = tmp_path / "out"
    # (with gather workers, the crash point would kill one of them; before the manifest: the parent)
    run_killed(_convert(rows, out, "--workers", "2" if point == "manifest" else "1"), point)
    assert not (out / "manifest.json").exists()
    if point == "manifest":  # every shard written: a companion gone makes its shard be written again
        assert len(list(out.glob("train-*.dir"))) == 5
        (out / "train-000002.dir" / LENGTHS).unlink()
    res = run_cli(*_convert(rows, out, "--workers", "2", quiet=False))
    assert res.exit_code == 0, res.stderr
    if point == "manifest":
        assert "resumed: 4 of 5 shards" in res.stderr, res.stderr
    assert tree_digest(out) == tree_digest(reference)
    assert run_cli("verify", out, "--deep").exit_code == 0


def test_a_file_left_in_a_shard_folder_is_taken_over_by_the_same_command_only(rows, tmp_path):
    """A killed run's shard folder is the run's own (``Folder`` holds ``**``): the same command
    takes the folder over; another command is refused until ``--overwrite``."""
    out = tmp_path / "out"
    run_killed(_convert(rows, out), "manifest")
    res = run_cli(*_convert(rows, out, shards=30))
    assert res.exit_code == 2 and "unfinished output of a different command" in res.stderr, res.stderr
    _ok(_convert(rows, out, "--overwrite", shards=30))
    assert sorted(p.name for p in out.glob("train-*.dir")) == [f"train-{i:06d}.dir" for i in range(4)]


# -- the conformance suite --------------------------------------------------------------------------------

class TestFolderFormat(FormatContract):
    """The format contract (``shardsmith.testing``) of a format that writes folders."""

    format = "folders"
    convert_args = ["--shard-samples", "20"]

    @pytest.fixture(scope="class", autouse=True)
    @classmethod
    def folder_plugin_for_the_class(cls) -> Iterator[None]:
        with registered():
            yield

    def make_inputs(self, folder: Path) -> None:
        docs = make_docs(100, seed=5, max_words=20)
        write_jsonl(folder / "a.jsonl", docs[:60])
        write_jsonl(folder / "sub" / "b.jsonl", docs[60:])


def test_the_suite_finds_a_file_the_format_does_not_declare(rows, tmp_path, monkeypatch):
    """What ``FormatContract.test_every_file_written_is_the_formats_own`` checks, seen to fail: a format
    that writes a folder it does not declare leaves it behind ``--overwrite`` and out of an upload."""
    import folder_format

    out = tmp_path / "out"
    monkeypatch.setattr(folder_format.FolderFormat, "own_files", OwnFiles())
    run_killed(_convert(rows, out), "manifest")
    res = run_cli(*_convert(rows, out, "--overwrite", shards=30))
    assert res.exit_code == 2 and "also found ['train-000000.dir'" in res.stderr, res.stderr
