"""Fixtures: small corpora and tokenizers built in code, and a CLI runner that runs as a user would."""

from __future__ import annotations

import hashlib
import json
import random
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from shardsmith.cli import main
from shardsmith.formats.webdataset.tarfmt import (
    parse_sample as _parse_sample,  # bound now: tests count calls of the patched one
)
from shardsmith.text.tokenize import train_bpe

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda", "mu", "nu", "xi", "omicron", "pi", "rho", "sigma", "tau", "upsilon", "phi", "chi", "psi", "omega", "the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "über", "café", "naïve", "東京", "🙂", "data", "shard", "token", "shuffle", "seed", "record"]


def make_docs(n: int, *, seed: int = 0, max_words: int = 60) -> list[str]:
    rng = random.Random(seed)
    docs = []
    for i in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(0, max_words))]
        punct = rng.choice(["", ".", "!", "?\n", ",  "])
        docs.append(f"doc {i}: " + " ".join(words) + punct)
    return docs


def write_jsonl(path: Path, docs: list[str], *, field: str = "text") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        for i, d in enumerate(docs):
            fh.write(json.dumps({"id": i, field: d}, ensure_ascii=False) + "\n")
    return path


def two_file_corpus(root: Path, n: int, *, seed: int, max_words: int, first: int) -> Path:
    """``n`` documents as ``a.jsonl`` (the first ``first``) and ``b.jsonl``: several tasks and files
    for the shuffle, the stages and the crash tests."""
    docs = make_docs(n, seed=seed, max_words=max_words)
    write_jsonl(root / "a.jsonl", docs[:first])
    write_jsonl(root / "b.jsonl", docs[first:])
    return root


def jpeg(seed: int, size: tuple[int, int] = (48, 40)) -> bytes:
    """A small random-noise JPEG, different for every seed."""
    import io

    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)).save(buf, format="JPEG", quality=85)
    return buf.getvalue()


def jpeg_folder(root: Path, *, classes: int, per_class: int) -> Path:
    """An image folder ``root/c{k}/{i}.jpg`` of distinct JPEGs."""
    for c in range(classes):
        (root / f"c{c}").mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            (root / f"c{c}" / f"{i}.jpg").write_bytes(jpeg(c * 10 + i))
    return root


def member_table(buf: bytes, offsets: Any, *, where: str = "s.tar") -> tuple:
    """A tar shard's member table parsed sample by sample (what the loader's numpy scan must equal)."""
    keys, first, data, size, ext, exts = [], [0], [], [], [], []
    for start, stop in zip(offsets, offsets[1:]):
        key, members = _parse_sample(buf, int(start), int(stop), int(offsets[-1]), where=where)
        keys.append(key)
        for e, d, n in members:
            if e not in exts:
                exts.append(e)
            ext.append(exts.index(e))
            data.append(d)
            size.append(n)
        first.append(len(data))
    return keys, first, data, size, ext, exts


def root_data() -> Path:
    """The real ROOT files of ../shared/data/root (or $SHARDSMITH_ROOT_DATA); skips without them."""
    import os

    env = os.environ.get("SHARDSMITH_ROOT_DATA")
    folder = Path(env) if env else Path(__file__).resolve().parents[2] / "shared/data/root"
    if not (folder / "uproot-HZZ.root").is_file():
        pytest.skip(f"real ROOT test files not found in {folder} (set SHARDSMITH_ROOT_DATA)")
    return folder


def tree_digest(folder: Path, *, skip: tuple[str, ...] = ("manifest.json", "README.md")) -> dict[str, str]:
    """sha256 of every file in a folder and its subfolders (the index folder), by relative path, for
    byte-identity checks (the manifest records the time, and it and the dataset card the command
    line, which differs between the runs compared: tests/test_card.py)."""
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.relative_to(folder).as_posix() not in skip}

def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for a test server)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def same_dataset(a: Path, b: Path) -> None:
    """Two output folders hold the same dataset: every file's bytes, and the manifests apart from
    when and by which command (its line and its run identity) and from where the inputs were read."""
    assert tree_digest(a) == tree_digest(b)
    ma, mb = (json.loads((d / "manifest.json").read_text()) for d in (a, b))
    for m in (ma, mb):
        m.pop("created"), m.pop("command"), m.pop("run", None)
        m["source"].pop("input_root", None)
    assert ma == mb



@dataclass
class Result:
    exit_code: int
    output: str
    stderr: str


def run_cli(*args: str | Path) -> Result:
    """Run the CLI in-process, as click would from a shell."""
    res = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
    return Result(res.exit_code, res.stdout, res.stderr)


def run_subprocess(*args: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "shardsmith", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=300)


# runs the command given after the file name and writes its children's peak RSS (KB) to that file: a
# process forked from this one (the test process, hundreds of MB) would report this one's peak as its
# own, as Linux carries the peak across fork and exec; one forked from the shim starts from its few MB
_PEAK_SHIM = ("import pathlib, resource, subprocess, sys; rc = subprocess.call(sys.argv[2:]); "
              "pathlib.Path(sys.argv[1]).write_text(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)); "
              "sys.exit(rc)")


def run_measured(*args: str | Path, env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess[str], int]:
    """The program in a subprocess, as ``run_subprocess``, and its own peak RSS in KB."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        peak = Path(folder) / "peak"
        res = subprocess.run([sys.executable, "-c", _PEAK_SHIM, str(peak), sys.executable, "-m", "shardsmith",
                              *map(str, args)], capture_output=True, text=True, env=env, timeout=300)
        return res, int(peak.read_text())


class Stall:
    """A run held at one of the program's fault points (``core.faults``) until the test releases it.

    ``env`` makes the run create ``mark`` when it gets there and wait until ``gate`` exists: the test
    does what it must while the run is held (another run, a signal, an edited input), then
    ``release()``s it. Nothing depends on how fast a loaded machine runs either process; a run never
    released waits ten minutes, far past any ``wait`` of the tests."""

    def __init__(self, folder: Path, point: str) -> None:
        stamp = f"{point.replace(':', '-')}-{time.monotonic_ns()}"
        self.mark = folder / f"stalled-{stamp}"
        self.gate = folder / f"released-{stamp}"
        self.env = {"SHARDSMITH_STALL_AT": point, "SHARDSMITH_STALL_MARK": str(self.mark),
                    "SHARDSMITH_STALL_UNTIL": str(self.gate)}

    def reached(self, proc: subprocess.Popen[Any], timeout: float = 300) -> None:
        """Wait until the run is held at its point (it fails the test if the run ends first)."""
        deadline = time.monotonic() + timeout
        while not self.mark.exists():
            if proc.poll() is not None:
                raise AssertionError(f"the run ended before its stall point: {proc.returncode} "
                                     f"{proc.stderr.read() if proc.stderr else ''}")
            assert time.monotonic() < deadline, "the run never reached its stall point"
            time.sleep(0.02)

    def release(self) -> None:
        self.gate.touch()


@pytest.fixture(scope="session")
def bpe_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small GPT-2-style byte-level BPE with <|endoftext|>, trained on the test vocabulary."""
    path = tmp_path_factory.mktemp("tok") / "bpe.json"
    path.write_text(train_bpe(make_docs(400, seed=99), vocab_size=400))
    return path


@pytest.fixture(scope="session")
def wordpiece_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A BERT-like WordPiece that, like sentence-transformers files, truncates at 16 and pads."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(vocab_size=300, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]"],
                                        show_progress=False)
    tok.train_from_iterator(make_docs(300, seed=7), trainer)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    tok.enable_truncation(16)
    tok.enable_padding(length=16, pad_id=0, pad_token="[PAD]")
    path = tmp_path_factory.mktemp("tok") / "wordpiece.json"
    tok.save(str(path))
    return path


@pytest.fixture
def corpus(tmp_path: Path) -> tuple[Path, list[str]]:
    """A folder of two JSONL files (300 documents) and the documents in input order."""
    docs = make_docs(300)
    root = tmp_path / "corpus"
    write_jsonl(root / "a.jsonl", docs[:170])
    write_jsonl(root / "sub" / "b.jsonl", docs[170:])
    return root, docs


def tar_archive(samples: list[tuple[str, list[tuple[str, bytes]]]]) -> tuple[bytes, list[int]]:
    """A whole tar shard and its sample offsets (n + 1), laid out as the webdataset writer does."""
    from shardsmith.formats.webdataset.tarfmt import end_of_archive, sample_members

    chunks, offsets, pos = [], [], 0
    for key, fields in samples:
        offsets.append(pos)
        for c in sample_members(key, fields):
            chunks.append(bytes(c))
            pos += len(c)
    offsets.append(pos)
    chunks.append(end_of_archive(pos))
    return b"".join(chunks), offsets
