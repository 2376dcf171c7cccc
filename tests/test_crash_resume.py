"""kill -9 at several points of a conversion, then the same command again: it resumes from the finished
work and ends with the bytes of an uninterrupted run. A different command into the folder is refused."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from conftest import (
    jpeg_folder,
    run_cli,
    run_subprocess,
    tree_digest,
    two_file_corpus,
)

from shardsmith.demo.icecube_like import make_icecube_kaggle_like

# many processes a test (stages, executors, kills, S3 servers): `make test-heavy`, not `make test`
pytestmark = pytest.mark.heavy


@pytest.fixture(scope="module")
def big_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """About 400 KB of JSONL in two files: several tasks at --memory 512KB."""
    return two_file_corpus(tmp_path_factory.mktemp("crash-corpus"), 3000, seed=3, max_words=50, first=1700)


def _crash(args: list[str | Path], point: str, *, parent: bool = False) -> None:
    env = {**os.environ, "SHARDSMITH_CRASH_AT": point}
    if parent:
        env["SHARDSMITH_CRASH_PARENT"] = "1"
    res = run_subprocess(*args, env=env)
    assert res.returncode == -signal.SIGKILL, (point, res.returncode, res.stderr)


def _ok(args: list[str | Path], **env: str) -> None:
    res = run_subprocess(*args, env={**os.environ, **env})
    assert res.returncode == 0, res.stderr


def _pack(corpus: Path, out: Path, tokenizer: Path, workers: int) -> list[str | Path]:
    return ["pack-tokens", corpus, "-o", out, "--tokenizer", tokenizer, "--memory", "512KB", "--workers",
            str(workers), "--split", "train=0.9,val=0.1", "--shard-tokens", "20K", "-q"]


@pytest.mark.parametrize("point, workers", [
    ("scatter:1", 1),        # while reading: task 0 finished, task 1 written, the rest not started
    ("scatter:2", 2),        # a worker dies and takes the run down with it
    ("gather:train:0", 1),   # while writing shards
    ("manifest", 1),         # every shard written, no manifest yet
])
def test_pack_tokens_resumes_after_kill_9(big_corpus, bpe_tokenizer, tmp_path, point, workers):
    reference = tmp_path / "ref"
    _ok(_pack(big_corpus, reference, bpe_tokenizer, 1))
    out = tmp_path / "out"
    _crash(_pack(big_corpus, out, bpe_tokenizer, workers), point, parent=workers > 1)
    assert not (out / "manifest.json").exists(), "a killed run never looks like a dataset"
    work = tmp_path / ".out.shardsmith-work"
    # the task that crashed wrote its part first (with 2 workers, task 0 may still have been running)
    done = int(point.split(":")[1]) if point.startswith("scatter:") else 0
    assert work.is_dir() and (work / f"part-{done:06d}.bin").is_file(), "finished parts survive the kill"
    # the rerun must not redo that task: were it read again, this crash point would kill the rerun too
    _ok(_pack(big_corpus, out, bpe_tokenizer, 2), SHARDSMITH_CRASH_AT=f"scatter:{done}")
    assert tree_digest(out) == tree_digest(reference)
    assert not work.exists() and not (out / ".shardsmith-run.json").exists()


def test_a_changed_input_is_read_again(big_corpus, bpe_tokenizer, tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for p in big_corpus.iterdir():
        (corpus / p.name).write_bytes(p.read_bytes())
    out = tmp_path / "out"
    _crash(_pack(corpus, out, bpe_tokenizer, 1), "scatter:1")
    with open(corpus / "a.jsonl", "a", encoding="utf-8") as fh:
        fh.write('{"text": "one more document"}\n')
    _ok(_pack(corpus, out, bpe_tokenizer, 1))
    reference = tmp_path / "ref"
    _ok(_pack(corpus, reference, bpe_tokenizer, 1))
    assert tree_digest(out) == tree_digest(reference)


def test_images_resume_after_a_kill_while_writing_shards(tmp_path):
    root = jpeg_folder(tmp_path / "imgs", classes=3, per_class=8)
    args = ["convert", root, "--to", "webdataset", "--shard-samples", "5", "--workers", "1", "-q"]
    _ok([*args, "-o", tmp_path / "ref"])
    _crash([*args, "-o", tmp_path / "out"], "shard:train:1")
    assert not (tmp_path / "out" / "manifest.json").exists()
    assert (tmp_path / "out" / "__index__" / "train-000001.offsets.npy").is_file()  # taken over by the rerun
    _ok([*args, "-o", tmp_path / "out"])
    assert tree_digest(tmp_path / "out") == tree_digest(tmp_path / "ref")


def test_events_resume_after_kill_9(tmp_path):
    batches, meta = make_icecube_kaggle_like(tmp_path / "ic", batches=2, events_per_batch=200, mean_pulses=30,
                                             seed=1, row_group_rows=2000)
    args = ["convert", *batches, "--group-by", "event_id", "--events-table", meta, "--to", "hdf5",
            "--memory", "256KB", "--workers", "1", "--shard-samples", "150", "-q"]
    _ok([*args, "-o", tmp_path / "ref"])
    _crash([*args, "-o", tmp_path / "out"], "scatter:1")
    _crash([*args, "-o", tmp_path / "out"], "gather:train:0")
    _ok([*args, "-o", tmp_path / "out"])
    assert tree_digest(tmp_path / "out") == tree_digest(tmp_path / "ref")


def test_a_different_command_is_refused_unless_overwrite(big_corpus, bpe_tokenizer, tmp_path):
    out = tmp_path / "out"
    _crash(_pack(big_corpus, out, bpe_tokenizer, 1), "gather:train:0")
    other = ["pack-tokens", big_corpus, "-o", out, "--tokenizer", bpe_tokenizer, "-q", "--seed", "7"]
    res = run_cli(*other)
    assert res.exit_code == 2 and "different command" in res.stderr and "--overwrite" in res.stderr, res.stderr
    res = run_cli(*other, "--overwrite")
    assert res.exit_code == 0, res.stderr
    # a finished dataset: the same command finds it complete (its manifest records the run), another
    # command needs --overwrite to replace it
    res = run_cli(*[a for a in other if a != "-q"])
    assert res.exit_code == 0 and "already complete" in res.stderr, res.stderr
    res = run_cli(*other[:-2])
    assert res.exit_code == 2 and "--overwrite" in res.stderr


def test_a_resumed_run_says_what_it_reused(big_corpus, bpe_tokenizer, tmp_path):
    """The rerun of a killed run says it resumed, and how much, on stderr (and nothing with -q)."""
    out = tmp_path / "out"
    args = [a for a in _pack(big_corpus, out, bpe_tokenizer, 1) if a != "-q"]
    _crash(args, "scatter:2")
    res = run_subprocess(*args, env=dict(os.environ))
    assert res.returncode == 0, res.stderr
    line = next((ln for ln in res.stderr.splitlines() if ln.startswith("resumed: ")), None)
    # the task that crashed wrote its part first (test_pack_tokens_resumes_after_kill_9): tasks 0 to 2 are reused
    # (killed while reading, before any shard: none to reuse)
    assert line is not None and line.startswith("resumed: 0 of ") and " shards and 3 of " in line, res.stderr
    assert "scatter tasks reused" in line
    assert "input bytes not read again" in line


def test_a_part_with_a_lying_or_older_footer_is_redone_on_resume(big_corpus, bpe_tokenizer, tmp_path):
    """A killed run's parts: one of an older shardsmith (another magic), one whose index lies (a
    segment's count past the file's end). The rerun takes neither as finished: it redoes both tasks,
    reuses the third, and writes the bytes of an uninterrupted run."""
    from shardsmith.engine.shuffle.partfile import INDEX, TRAILER

    reference = tmp_path / "ref"
    _ok(_pack(big_corpus, reference, bpe_tokenizer, 1))
    out = tmp_path / "out"
    args = [a for a in _pack(big_corpus, out, bpe_tokenizer, 1) if a != "-q"]
    _crash(args, "scatter:2")
    work = tmp_path / ".out.shardsmith-work"
    old = work / "part-000000.bin"
    data = bytearray(old.read_bytes())
    data[-8:] = b"SSPART01"
    old.write_bytes(bytes(data))
    lying = work / "part-000001.bin"
    data = bytearray(lying.read_bytes())
    index_at = TRAILER.unpack(bytes(data[-TRAILER.size:]))[0]
    count_at = index_at + INDEX.fields["count"][1]
    data[count_at:count_at + 8] = (1 << 40).to_bytes(8, "little")
    lying.write_bytes(bytes(data))
    res = run_subprocess(*args, env=dict(os.environ))
    assert res.returncode == 0, res.stderr
    assert " and 1 of " in next(ln for ln in res.stderr.splitlines() if ln.startswith("resumed: ")), res.stderr
    assert tree_digest(out) == tree_digest(reference)
