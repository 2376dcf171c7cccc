"""Side files the command line reads whole (a tokenizer and the files beside it, a chat template,
``--decontaminate`` benchmarks, a recipe, a loader state): a FIFO, a device, a folder or a file
over its limit is one line and exit 2, before a byte is read (``core/side_file.py``); a byte order
mark does not hide a benchmark's first item."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from chat_models import CHATML, model_folder, tokenizer_json
from conftest import make_docs, run_cli, write_jsonl

from shardsmith.text.decontaminate import Benchmarks


@pytest.fixture
def fifo(tmp_path):
    """A FIFO. Should anything open it to read and wait for a writer (the bug), a watchdog writes a
    line and closes it, so that the test fails on what was read instead of hanging."""
    path = tmp_path / "named.pipe"
    os.mkfifo(path)
    stop = threading.Event()

    def feed() -> None:
        while not stop.wait(0.05):
            try:
                fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)  # ENXIO while no one reads
            except OSError:
                continue
            with contextlib.suppress(OSError):
                os.write(fd, b'{"text": "fed"}\n')
            os.close(fd)

    watchdog = threading.Thread(target=feed, daemon=True)
    watchdog.start()
    yield path
    stop.set()
    watchdog.join()


def _sparse(path: Path, size: int) -> Path:
    with open(path, "wb") as fh:
        fh.truncate(size)
    return path


@pytest.fixture(scope="module")
def chat_folder(tmp_path_factory) -> Path:
    return model_folder(tmp_path_factory.mktemp("chatml"), tokenizer_json(kind="gpt2"), CHATML)


@pytest.fixture
def inputs(tmp_path) -> Path:
    write_jsonl(tmp_path / "in" / "a.jsonl", make_docs(20, seed=1))
    (tmp_path / "chat").mkdir()
    (tmp_path / "chat" / "c.jsonl").write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    return tmp_path


def _one_line(res, *words: str) -> None:
    assert res.exit_code == 2, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr, res.stderr
    for w in words:
        assert w in res.stderr, res.stderr


@pytest.mark.parametrize("kind", ["fifo", "folder", "huge"])
def test_options_naming_a_file_refuse_what_is_no_small_regular_file(inputs, bpe_tokenizer, chat_folder, fifo,
                                                                     kind):
    odd = {"fifo": fifo, "folder": inputs / "in", "huge": None}[kind]
    said = {"fifo": "a FIFO, not a regular file", "folder": "folder", "huge": "read for it"}[kind]
    base = ("pack-tokens", inputs / "in", "-o", inputs / "out", "-q")
    chat = ("pack-tokens", inputs / "chat", "-o", inputs / "out", "-q", "--chat", "--tokenizer",
            chat_folder / "tokenizer.json")
    runs = {
        "--tokenizer": (*base, "--tokenizer", odd or _sparse(inputs / "big.json", 1001 * 10**6)),
        "--decontaminate": (*base, "--tokenizer", bpe_tokenizer, "--decontaminate",
                            odd or _sparse(inputs / "big.txt", 2001 * 10**6)),
        "--chat-template": (*chat, "--chat-template", odd or _sparse(inputs / "big.jinja", 11 * 10**6)),
    }
    for option, args in runs.items():
        if kind == "folder" and option == "--decontaminate":
            continue  # click's dir_okay=False says so itself (--chat-template's folder: the side-file check)
        res = run_cli(*args)
        _one_line(res, option, said)
    assert not (inputs / "out" / "manifest.json").exists()


@pytest.mark.parametrize("name", ["tokenizer_config.json", "chat_template.jinja", "config.json",
                                  "special_tokens_map.json"])
def test_a_fifo_beside_the_tokenizer_is_refused(inputs, chat_folder, tmp_path, fifo, name):
    folder = tmp_path / "tok"
    folder.mkdir()
    for f in chat_folder.iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    (folder / name).unlink(missing_ok=True)
    os.rename(fifo, folder / name)
    res = run_cli("pack-tokens", inputs / "chat", "-o", inputs / "out", "-q", "--chat", "--tokenizer",
                  folder / "tokenizer.json")
    _one_line(res, name, "a FIFO, not a regular file")


def test_a_recipe_and_a_loader_state_that_are_fifos(inputs, bpe_tokenizer, fifo):
    _one_line(run_cli("run", fifo), "a FIFO, not a regular file")
    made = run_cli("pack-tokens", inputs / "in", "-o", inputs / "out", "-q", "--tokenizer", bpe_tokenizer)
    assert made.exit_code == 0, made.stderr
    _one_line(run_cli("trace", inputs / "out", "--state", fifo), "--state", "a FIFO, not a regular file")


@pytest.mark.parametrize(("option", "device"), [("--decontaminate", "/dev/zero"), ("--decontaminate", "/dev/urandom"),
                                                 ("--tokenizer", "/dev/zero"), ("--chat-template", "/dev/zero")])
def test_endless_devices_are_refused_before_a_byte_is_read(inputs, bpe_tokenizer, chat_folder, option, device):
    """In a process held to 3 GB (an endless read would end there, in a MemoryError traceback)."""
    if not os.path.exists(device):
        pytest.skip(f"no {device} here")
    args = {"--decontaminate": ("--tokenizer", bpe_tokenizer, "--decontaminate", device),
            "--tokenizer": ("--tokenizer", device),
            "--chat-template": ("--chat", "--tokenizer", chat_folder / "tokenizer.json", "--chat-template", device)}
    source = inputs / ("chat" if option == "--chat-template" else "in")

    def held() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))

    res = subprocess.run([sys.executable, "-m", "shardsmith", "pack-tokens", source, "-o", inputs / "out", "-q",
                          *map(str, args[option])], capture_output=True, text=True, timeout=300, preexec_fn=held)
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip().splitlines() == [f"shardsmith: error: {option}: {device}: a character device, "
                                               f"not a regular file"], res.stderr


@pytest.mark.parametrize("suffix", [".txt", ".jsonl"])
def test_a_byte_order_mark_does_not_hide_the_first_item(tmp_path, suffix):
    first = "Alpha beta gamma"
    body = (first + "\nsomething else entirely\n") if suffix == ".txt" else \
        json.dumps({"text": first}) + "\n" + json.dumps({"text": "something else entirely"}) + "\n"
    path = tmp_path / f"bench{suffix}"
    path.write_bytes(b"\xef\xbb\xbf" + body.encode())
    b = Benchmarks.load([str(path)], ngram=13)
    assert b.match(["they said alpha beta gamma twice", "no match here"]).tolist() == [0, -1]
    assert b.item(0) == (str(path), 1)
