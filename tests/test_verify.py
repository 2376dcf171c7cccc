"""shardsmith verify: sizes and sha256 against the manifest; --deep opens every sample."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
from conftest import jpeg, make_docs, run_cli, write_jsonl
from test_convert import convert


def packed(tmp_path: Path, tokenizer: Path) -> Path:
    write_jsonl(tmp_path / "in" / "a.jsonl", make_docs(80))
    res = run_cli("pack-tokens", tmp_path / "in", "-o", tmp_path / "out", "--tokenizer", tokenizer, "-q",
                  "--shard-tokens", "1000", "--nanogpt")
    assert res.exit_code == 0, res.stderr
    return tmp_path / "out"


def rehash(out: Path, rel: str) -> None:
    """Make the manifest agree with a file changed on purpose, so only --deep can see the damage."""
    m = json.loads((out / "manifest.json").read_text())
    data = (out / rel).read_bytes()
    for split in m["splits"].values():
        for shard in split["shards"]:
            for entry in (shard, shard.get("index", {})):
                if entry.get("path") == rel:
                    entry["sha256"] = hashlib.sha256(data).hexdigest()
                    entry["bytes"] = len(data)
    (out / "manifest.json").write_text(json.dumps(m))


def test_a_clean_dataset_verifies(tmp_path, bpe_tokenizer):
    out = packed(tmp_path, bpe_tokenizer)
    res = run_cli("verify", out, "--deep")
    assert res.exit_code == 0 and ": OK:" in res.output and "(deep)" in res.output


def test_one_flipped_byte_or_a_missing_shard_fails(tmp_path, bpe_tokenizer):
    out = packed(tmp_path, bpe_tokenizer)
    shard = out / "train-000001.bin"
    data = bytearray(shard.read_bytes())
    data[5] ^= 1
    shard.write_bytes(bytes(data))
    (out / "train-000002.idx").unlink()
    res = run_cli("verify", out)
    assert res.exit_code == 1
    assert "FAIL train-000001.bin: sha256" in res.output and "FAIL train-000002.idx: missing" in res.output
    assert "2 problems" in res.output


def test_deep_finds_token_ids_outside_the_vocabulary(tmp_path, bpe_tokenizer):
    out = packed(tmp_path, bpe_tokenizer)
    tokens = np.fromfile(out / "train-000000.bin", dtype=np.uint16)
    tokens[3] = 60000
    tokens.tofile(out / "train-000000.bin")
    rehash(out, "train-000000.bin")
    assert run_cli("verify", out).exit_code == 0  # sizes and hashes agree now
    res = run_cli("verify", out, "--deep")
    assert res.exit_code == 1 and "token 60000 at position 3 is outside the vocabulary of 400" in res.output


def test_deep_finds_corrupt_tar_headers_and_images(tmp_path):
    root = tmp_path / "imgs" / "a"
    root.mkdir(parents=True)
    for i in range(6):
        (root / f"{i}.jpg").write_bytes(jpeg(i))
    convert(tmp_path / "imgs", "-o", tmp_path / "out", "--no-shuffle")
    tar = tmp_path / "out" / "train-000000.tar"
    data = bytearray(tar.read_bytes())
    size = int(data[124:135], 8)
    data[512 + size - 2: 512 + size] = b"\0\0"  # the first image loses its EOI marker: headers still fine
    tar.write_bytes(bytes(data))
    rehash(tmp_path / "out", "train-000000.tar")
    assert run_cli("verify", tmp_path / "out").exit_code == 0
    res = run_cli("verify", tmp_path / "out", "--deep")
    assert res.exit_code == 1 and "train[0]" in res.output and "EOI" in res.output, res.output
    data[148] ^= 0x01  # the first header's checksum
    tar.write_bytes(bytes(data))
    rehash(tmp_path / "out", "train-000000.tar")
    res = run_cli("verify", tmp_path / "out", "--deep")
    assert res.exit_code == 1 and "tar header at byte 0" in res.output


def test_not_a_dataset(tmp_path):
    res = run_cli("verify", tmp_path)
    assert res.exit_code == 1 and "no manifest.json" in res.output
