"""The exact command of a finished run, run again, is a target that is up to date (issue 32): it says
"already complete", exits 0 and leaves the folder as it was. Another command into the folder is
still refused; a dataset whose files changed since is never called complete; a killed run's rerun
says what it reused."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import jpeg_folder, run_cli, run_subprocess, tree_digest, two_file_corpus

# many processes a test (DataLoader workers, killed ranks, an S3 server, a browser) or long: `make test-heavy`
pytestmark = pytest.mark.heavy

REPO = Path(__file__).resolve().parents[1]


def _snapshot(folder: Path) -> dict[str, tuple[str, int]]:
    """Every file's sha256 and modification time: a run that rewrote a file (even with the same
    bytes) shows."""
    digests = tree_digest(folder, skip=())
    return {rel: (sha, (folder / rel).stat().st_mtime_ns) for rel, sha in digests.items()}


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    """A folder laid out as the clone is where ``make data`` runs (the recipes and the bundled corpus)."""
    (tmp_path / "examples").symlink_to(REPO / "examples")
    (tmp_path / "recipes").symlink_to(REPO / "recipes")
    return tmp_path


def _make_data(clone: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """``make data RECIPE=recipes/tiny-tokens.toml`` (what its rule runs), with ``extra`` arguments."""
    return subprocess.run([sys.executable, "-m", "shardsmith", "run", "recipes/tiny-tokens.toml", *extra],
                          cwd=clone, capture_output=True, text=True, timeout=300)


def test_the_tiny_recipe_twice_is_already_complete_and_leaves_the_folder_as_it_was(clone):
    first = _make_data(clone)
    assert first.returncode == 0 and "already complete" not in first.stderr, first.stderr
    out = clone / "build" / "tiny-tokens"
    before = _snapshot(out)
    assert "manifest.json" in before and "train.bin" in before
    again = _make_data(clone)
    assert again.returncode == 0, again.stderr
    assert f"{out}: already complete (this same command finished it; nothing to do)" in again.stderr
    assert "Traceback" not in again.stderr and "--overwrite" not in again.stderr
    assert _snapshot(out) == before, "an already complete run touched the folder"
    assert sorted(p.name for p in clone.iterdir()) == ["build", "examples", "recipes"]  # no scratch folder left


def test_another_option_into_a_finished_folder_is_still_refused(clone):
    assert _make_data(clone).returncode == 0
    out = clone / "build" / "tiny-tokens"
    before = _snapshot(out)
    other = _make_data(clone, "--set", "seq-len=64")
    assert other.returncode == 2 and "already complete" not in other.stderr, other.stderr
    # the refusal names what differs from the command that made it (a recipe's options as it runs them)
    assert other.stderr.strip().splitlines()[-1] == (f"shardsmith: error: -o {out}: holds a finished "
                                                     "dataset made with other options: --seq-len 128 (now 64); pass "
                                                     "--overwrite to replace it"), other.stderr
    assert len(other.stderr.strip().splitlines()[-1]) < 300 and "Traceback" not in other.stderr
    assert _snapshot(out) == before


def test_a_finished_dataset_whose_files_changed_is_not_complete(clone):
    assert _make_data(clone).returncode == 0
    out = clone / "build" / "tiny-tokens"
    m = json.loads((out / "manifest.json").read_text())
    val_shard = m["splits"]["val"]["shards"][0]["path"]
    (out / val_shard).unlink()
    res = _make_data(clone)
    assert res.returncode == 2 and "already complete" not in res.stderr, res.stderr
    line = res.stderr.strip().splitlines()[-1]
    assert "changed since" in line and f"{val_shard} is missing" in line and "--overwrite" in line, line
    assert not (out / val_shard).exists(), "a refused run removed or wrote nothing"

    # --overwrite makes it again; then the same command finds it complete again
    remade = _make_data(clone, "--set", "overwrite=true")
    assert remade.returncode == 0 and (out / val_shard).is_file(), remade.stderr
    assert "already complete" in _make_data(clone).stderr

    # a file rewritten in place with as many bytes (written after the manifest) is a change too
    tok = out / "tokenizer.json"
    tok.write_bytes(tok.read_bytes())
    os.utime(tok, ns=(tok.stat().st_atime_ns, (out / "manifest.json").stat().st_mtime_ns + 10**9))
    train = out / "train.bin"
    with open(train, "ab") as fh:
        fh.write(b"\0\0")
    res = _make_data(clone)
    assert res.returncode == 2, res.stderr
    line = res.stderr.strip().splitlines()[-1]
    assert "tokenizer.json was modified after the manifest was written" in line, line
    want = m["nanogpt"]["train"]["bytes"]
    assert f"train.bin is {want + 2:,} bytes, the manifest says {want:,}" in line, line


def test_the_same_convert_twice_is_complete_and_a_missing_index_is_not(tmp_path):
    """Not only pack-tokens: a webdataset conversion, its offset index deleted."""
    root = jpeg_folder(tmp_path / "imgs", classes=2, per_class=4)
    out = tmp_path / "wds"
    args = ["convert", root, "-o", out, "--to", "webdataset", "--shard-samples", "3", "--workers", "1"]
    assert run_cli(*args).exit_code == 0
    before = _snapshot(out)
    again = run_cli(*args)
    assert again.exit_code == 0 and "already complete" in again.stderr, again.stderr
    assert _snapshot(out) == before
    index = next((out / "__index__").glob("*.offsets.npy"))
    index.unlink()
    res = run_cli(*args)
    assert res.exit_code == 2 and f"__index__/{index.name} is missing" in res.stderr, res.stderr


def test_a_killed_run_rerun_says_how_many_shards_and_tasks_it_reused(tmp_path, bpe_tokenizer):
    corpus = two_file_corpus(tmp_path / "corpus", 3000, seed=3, max_words=50, first=1700)

    def pack(out: Path) -> list[str | Path]:  # two gather workers: the shard ranges are planned, each kept
        return ["pack-tokens", corpus, "-o", out, "--tokenizer", bpe_tokenizer, "--memory", "512KB",
                "--workers", "2", "--split", "train=0.9,val=0.1", "--shard-tokens", "20K"]

    out = tmp_path / "out"
    killed = run_subprocess(*pack(out), env={**os.environ, "SHARDSMITH_CRASH_AT": "manifest"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr  # every shard written, no manifest
    rerun = run_subprocess(*pack(out))
    assert rerun.returncode == 0, rerun.stderr
    lines = [ln for ln in rerun.stderr.splitlines() if ln.startswith("resumed: ")]
    assert len(lines) == 1, rerun.stderr
    found = re.fullmatch(r"resumed: (\d+) of (\d+) shards and (\d+) of (\d+) scatter tasks reused from a killed "
                         r"run of this command \(([\d,]+) input bytes not read again\)", lines[0])
    assert found, lines[0]
    shards, of_shards, tasks, of_tasks, unread = (int(g.replace(",", "")) for g in found.groups())
    m = json.loads((out / "manifest.json").read_text())
    train = len(m["splits"]["train"]["shards"])
    assert train > 1 and of_shards == train + len(m["splits"]["val"]["shards"])
    assert train <= shards <= of_shards  # every planned train shard was taken over as it was
    assert tasks == of_tasks > 1 and unread == m["source"]["input_bytes"]
    reference = tmp_path / "ref"
    assert run_subprocess(*pack(reference)).returncode == 0
    assert tree_digest(out) == tree_digest(reference)
    # a fresh run says nothing of the kind; the rerun of a finished one is complete
    fresh = run_subprocess(*pack(tmp_path / "fresh"))
    assert fresh.returncode == 0 and "resumed" not in fresh.stderr, fresh.stderr
    done = run_subprocess(*pack(out))
    assert done.returncode == 0 and "already complete" in done.stderr and "resumed" not in done.stderr


def test_a_dry_run_of_the_tiny_recipe_away_from_the_clone_names_its_missing_input(tmp_path):
    """``make data`` runs in the clone; from anywhere else the dry run says which input is missing."""
    res = subprocess.run([sys.executable, "-m", "shardsmith", "run", str(REPO / "recipes" / "tiny-tokens.toml"),
                          "--dry-run"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert "no such input: examples/corpus" in res.stderr and res.stdout == ""
    ok = subprocess.run([sys.executable, "-m", "shardsmith", "run", "recipes/tiny-tokens.toml", "--dry-run"],
                        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0 and ok.stdout.startswith("shardsmith pack-tokens examples/corpus "), ok.stderr


@pytest.mark.parametrize("url, message", [
    ("s3://", "input s3://: names no bucket or server"),
    ("htps://host/a.jsonl", "unknown URL scheme htps://"),
    ("file:///data/a.jsonl", "give the local path instead of a file:// URL"),
])
def test_a_dry_run_checks_the_form_of_url_inputs(url, message):
    """A URL is not listed by a dry run (no network), but one the run would refuse outright is named."""
    res = run_cli("run", REPO / "recipes" / "tiny-tokens.toml", "--set", f"inputs={url}", "--dry-run")
    assert res.exit_code == 2 and message in res.stderr and "Traceback" not in res.stderr, res.stderr
    fine = run_cli("run", REPO / "recipes" / "tiny-tokens.toml", "--set", "inputs=s3://bucket/corpus/", "--dry-run")
    assert fine.exit_code == 0, fine.stderr


def test_the_same_command_after_its_inputs_changed_says_so(tmp_path, bpe_tokenizer):
    """The same command line, but an input was edited since the finished run: not complete, and the
    line says why (not only that the folder is not empty)."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for part in (REPO / "examples" / "corpus").glob("*.jsonl"):
        (corpus / part.name).write_bytes(part.read_bytes())
    out = tmp_path / "out"
    args = ["pack-tokens", corpus, "-o", out, "--tokenizer", bpe_tokenizer, "-q"]
    first = run_cli(*args)
    assert first.exit_code == 0, first.stderr
    with open(corpus / "part-0.jsonl", "a", encoding="utf-8") as fh:
        fh.write('{"text": "one more document"}\n')
    res = run_cli(*args)
    assert res.exit_code == 2 and "already complete" not in res.stderr, res.stderr
    assert "holds the dataset this same command made from other inputs" in res.stderr and "--overwrite" in res.stderr
    assert run_cli(*args, "--overwrite").exit_code == 0
    assert "already complete" in run_cli(*args[:-1]).stderr
