"""What a newcomer meets in the first hour (issue 32): messages that say what to do, logs without
carriage returns, a `run -q`, a report that counts what the loader delivers, each as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import jpeg_folder, write_jsonl

ROOT = Path(__file__).resolve().parent.parent


def _cli(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """The program with stdout and stderr to pipes, as in a batch job's log."""
    return subprocess.run([sys.executable, "-m", "shardsmith", *map(str, args)], capture_output=True, text=True,
                          timeout=300, cwd=cwd)


def test_progress_in_a_pipe_is_plain_lines(tmp_path):
    res = _cli("pack-tokens", ROOT / "examples/corpus", "-o", tmp_path / "t", "--train-tokenizer", "300")
    assert res.returncode == 0, res.stderr
    assert "\r" not in res.stderr and "\x1b" not in res.stderr
    steps = [line.split(":")[0] for line in res.stderr.splitlines()]
    assert {"listing corpus", "tokenize", "gather"} <= set(steps), res.stderr
    assert all(line.endswith(" s") for line in res.stderr.splitlines() if line.startswith(("tokenize:", "gather:")))
    assert res.stderr.startswith("listing corpus: 2 files, ")
    one = write_jsonl(tmp_path / "one" / "a.jsonl", [f"text {i}" for i in range(5)])
    res = _cli("convert", one.parent, "-o", tmp_path / "w", "--to", "webdataset", "--text-field", "text")
    assert res.returncode == 0 and "\r" not in res.stderr, res.stderr
    assert res.stderr.splitlines()[0].startswith("listing one: 1 file, "), res.stderr  # one file, not "1 files"


def test_a_terminal_still_gets_bars(tmp_path):
    """The plain lines are for pipes only: stderr on a terminal (a pty) gets tqdm's redrawn bars."""
    import fcntl
    import os
    import pty
    import struct
    import termios
    import tty

    leader, follower = pty.openpty()
    tty.setraw(follower)  # no newline translation: a carriage return read back is one the program wrote
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a new pty is 0 columns wide
    proc = subprocess.Popen([sys.executable, "-m", "shardsmith", "pack-tokens", str(ROOT / "examples/corpus"), "-o",
                             str(tmp_path / "t"), "--train-tokenizer", "300"], stdout=subprocess.DEVNULL,
                            stderr=follower)
    os.close(follower)
    drawn = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the pty closes when the program ends
            break
        if not chunk:
            break
        drawn += chunk
    os.close(leader)
    assert proc.wait(timeout=300) == 0, drawn
    assert b"\r" in drawn and b"tokenize" in drawn, drawn
    assert not any(line.startswith(b"tokenize: ") and line.endswith(b" s") for line in drawn.split(b"\n")), drawn


def test_a_small_corpus_says_it_trained_fewer_tokens_than_asked(tmp_path):
    res = _cli("pack-tokens", ROOT / "examples/corpus", "-o", tmp_path / "t", "--train-tokenizer", "32000", "-q")
    assert res.returncode == 0, res.stderr
    tok = json.loads((tmp_path / "t" / "manifest.json").read_text())["tokenizer"]
    assert tok["vocab_size_asked"] == 32000 and tok["vocab_size"] < 32000
    assert f"--train-tokenizer 32000: trained {tok['vocab_size']:,} tokens (the corpus has no more merges)" in res.stdout
    res = _cli("pack-tokens", ROOT / "examples/corpus", "-o", tmp_path / "u", "--train-tokenizer", "300", "-q")
    assert "--train-tokenizer" not in res.stdout  # got what was asked: nothing to say


def test_the_wrong_text_field_names_the_fields_and_the_option(tmp_path):
    src = write_jsonl(tmp_path / "in" / "a.jsonl", [f"text {i}" for i in range(5)], field="body")
    for args in (["pack-tokens", src, "--train-tokenizer", "300"], ["convert", src, "--to", "webdataset",
                                                                     "--text-field", "text"]):
        res = _cli(*args, "-o", tmp_path / "out")
        assert res.returncode == 1, res.stderr
        assert res.stderr.strip().splitlines()[-1] == ("shardsmith: error: a.jsonl: line 1: no 'text' field; its fields: id, body "
                                      "(name the text with --text-field, or pass --on-error skip to skip such "
                                      "records)"), res.stderr


def test_a_parquet_file_without_the_text_column_names_its_columns_and_the_option(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"id": [1, 2], "body": ["a b c", "d e"]}), tmp_path / "in" / "a.parquet")
    res = _cli("pack-tokens", tmp_path / "in", "--train-tokenizer", "300", "-o", tmp_path / "out", "-q")
    assert res.returncode == 1 and res.stderr.strip() == ("shardsmith: error: a.parquet: no 'text' column; its "
                                                          "columns: id, body (name the text with --text-field)")
    res = _cli("pack-tokens", tmp_path / "in", "--train-tokenizer", "300", "-o", tmp_path / "out", "-q",
               "--text-field", "body")
    assert res.returncode == 0, res.stderr  # the option it names is the way out


def test_run_has_quiet_and_a_bad_set_suggests_a_command_that_runs(tmp_path):
    recipe = tmp_path / "r.toml"
    recipe.write_text(f'command = "pack-tokens"\ninputs = ["{ROOT / "examples/corpus"}"]\nout = "{tmp_path / "o"}"\n'
                      '[options]\ntrain-tokenizer = 300\n')
    res = _cli("run", recipe, "-q")
    assert res.returncode == 0 and res.stderr == "", res.stderr
    for extra in ([], ["--dry-run"]):
        res = _cli("run", recipe, "--set", "bogus=3", *extra)
        assert res.returncode == 2 and "No such option '--bogus'" in res.stderr, res.stderr
        tried = next(line for line in res.stderr.splitlines() if line.startswith("Try '"))
        suggested = tried.split("'")[1].split()
        assert suggested[:2] == ["shardsmith", "pack-tokens"], tried
        assert _cli(*suggested[1:]).returncode == 0  # the suggested help runs
    images = tmp_path / "images.toml"
    images.write_text(f'command = "convert"\ninputs = ["{tmp_path}"]\nout = "{tmp_path / "w"}"\n'
                      '[options]\nto = "webdataset"\n')
    res = _cli("run", images, "--set", "to=nope")  # a bad value, not only an unknown option
    assert res.returncode == 2 and "Invalid value for '--to'" in res.stderr, res.stderr
    tried = next(line for line in res.stderr.splitlines() if line.startswith("Try '"))
    assert tried == "Try 'shardsmith convert --help' for help." and _cli("convert", "--help").returncode == 0


def test_option_and_folder_errors_say_it_once_and_plainly(tmp_path):
    res = _cli("pack-tokens", ROOT / "examples/corpus", "-o", tmp_path / "o", "--train-tokenizer", "300",
               "--split", "train=2")
    assert res.returncode == 2 and res.stderr.count("--split") == 1, res.stderr
    res = _cli("inspect", tmp_path / "nothere")
    assert res.returncode == 2 and res.stderr.strip() == f"shardsmith: error: {tmp_path / 'nothere'}: no such file or folder"
    (tmp_path / "empty").mkdir()
    res = _cli("convert", tmp_path / "empty", "-o", tmp_path / "o2", "--to", "webdataset")
    listed = res.stderr.split("no input files (")[1].split(")")[0].split(", ")
    assert res.returncode == 2 and len(listed) == len(set(listed)) and ".parquet" in listed, res.stderr


def test_a_skipped_image_says_why_not_rest_of_the_file(tmp_path):
    root = jpeg_folder(tmp_path / "imgs", classes=2, per_class=3)
    (root / "c0" / "img_0003.jpg").write_bytes((root / "c1" / "0.jpg").read_bytes()[:100])
    (root / "c1" / "bad.png").write_bytes(b"notanimage")
    res = _cli("convert", root, "-o", tmp_path / "out", "--to", "webdataset", "--on-error", "skip", "-q")
    assert res.returncode == 0, res.stderr
    assert res.stderr.strip() == (f"{tmp_path / 'out'}: skipped c0/img_0003.jpg: truncated JPEG: header ends before "
                                  "the frame size; c1/bad.png: not an image (unknown magic bytes 6e6f7461); "
                                  f"reasons in {tmp_path / 'out'}/manifest.json"), res.stderr
