"""Progress bars where long work was silent (issue 17 point 7): listing the input folder, training a
tokenizer, the engine check and the gather; ``--quiet`` silences every one.

The CLI runs in-process here (click's runner), whose stderr is not a terminal: each step is one plain line
when it ends, as in a batch job's log (a terminal gets tqdm bars that clear when done)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

from conftest import make_docs, run_cli, write_jsonl

from shardsmith.engine.inputs import folder_listing
from shardsmith.engine.inputs.files import discover

BARS = ("listing corpus", "train tokenizer: merging", "engine check", "tokenize", "gather")


def test_bars_appear_on_stderr_and_quiet_silences_them(tmp_path):
    corpus = tmp_path / "corpus"
    write_jsonl(corpus / "a.jsonl", make_docs(200))
    write_jsonl(corpus / "sub" / "b.jsonl", make_docs(100, seed=1))
    loud = run_cli("pack-tokens", corpus, "--train-tokenizer", "300", "--workers", "2", "-o", tmp_path / "loud")
    assert loud.exit_code == 0, loud.stderr
    for bar in BARS:
        line = next((ln for ln in loud.stderr.splitlines() if ln.startswith(f"{bar}:")), None)
        assert line is not None and line.endswith(" s"), (bar, loud.stderr)
    assert "\r" not in loud.stderr
    quiet = run_cli("pack-tokens", corpus, "--train-tokenizer", "300", "--workers", "2", "-q", "-o", tmp_path / "q")
    assert quiet.exit_code == 0 and quiet.stderr == "", quiet.stderr


def test_the_gather_bar_of_a_convert(tmp_path):
    corpus = write_jsonl(tmp_path / "in" / "rows.jsonl", make_docs(50))
    res = run_cli("convert", corpus.parent, "--to", "webdataset", "--text-field", "text", "--workers", "1",
                  "-o", tmp_path / "out")
    assert res.exit_code == 0 and "gather: 50 samples, " in res.stderr, res.stderr


class Recorder:
    """A ``core.progress.Progress`` that keeps what its bars were told instead of drawing them."""

    def __init__(self) -> None:
        self.bars: dict[str, list] = {}

    @contextmanager
    def bar(self, *, total: int | None, desc: str, unit: str = "it") -> Iterator[Any]:
        told = self.bars.setdefault(desc, [total])
        yield SimpleNamespace(update=told.append, set_description=lambda d: None)


def test_the_listing_counts_every_file_of_a_big_flat_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(folder_listing, "TICK_ENTRIES", 40)  # a tick every 40 files instead of 4096: a smaller folder
    folder = tmp_path / "many"
    folder.mkdir()
    for i in range(140):  # more than one tick's worth in a single folder
        (folder / f"{i:05d}.jsonl").write_bytes(b"")
    (folder / "skip.txt").write_bytes(b"")
    progress = Recorder()
    found = discover([str(folder)], suffixes=(".jsonl",), progress=progress)
    total, *ticks = progress.bars["listing many"]
    assert total is None and len(ticks) >= 3 and sum(ticks) == len(found) == 140
