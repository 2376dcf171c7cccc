"""Crafted sidecars and loader states (issue 42, item 9): a ``.npy`` sidecar whose header lies (10**11
rows, a zero-size dtype, an object dtype) or that is empty or cut, a loader state that claims a
billion workers or a float or boolean count, an index beyond int64. Each is refused in one line (a
DatasetError or ValueError for the API, exit 1 or 2 for the command line) before anything its
numbers size is allocated or looped over; the readers run under an address-space limit where the
lie used to allocate gigabytes. ``bench/campaign_crafted.py`` runs these attacks and more at random."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import make_docs, run_cli, write_jsonl

import shardsmith
from shardsmith.errors import DatasetError
from shardsmith.formats.tokens.packed import PackedSequences
from shardsmith.kit.rank_split import global_position

SEQ = 16
LIMIT = 2 << 30  # the address space a crafted reader runs in: a lie that allocates fails it


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory, bpe_tokenizer: Path) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("crafted-sidecars")
    write_jsonl(root / "in" / "a.jsonl", make_docs(120, seed=3, max_words=25))
    out = {"plain": root / "plain", "packed": root / "packed"}
    for name, extra in (("plain", []), ("packed", ["--pack", "best-fit", "--pack-window", "256"])):
        res = run_cli("pack-tokens", root / "in", "-o", out[name], "--tokenizer", bpe_tokenizer, "--provenance", "-q",
                      "--shard-tokens", "1K", "--seq-len", str(SEQ), *extra)
        assert res.exit_code == 0, res.stderr
    return out


def rehash(out: Path) -> None:
    """The manifest made to agree with the crafted files (every entry's size and sha256, nested ones
    too), so the lie reaches the reader."""
    m = json.loads((out / "manifest.json").read_text())
    stack: list = [m["splits"], m.get("files") or []]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            if isinstance(value.get("path"), str) and "sha256" in value and (out / value["path"]).is_file():
                data = (out / value["path"]).read_bytes()
                value["bytes"], value["sha256"] = len(data), hashlib.sha256(data).hexdigest()
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    (out / "manifest.json").write_text(json.dumps(m))


def npy_head(descr: str, shape: str) -> bytes:
    header = f"{{'descr': {descr}, 'fortran_order': False, 'shape': {shape}, }}"
    text = (header + " " * (-(10 + len(header) + 1) % 64) + "\n").encode("latin1")
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text


def body(raw: bytes) -> bytes:
    return raw[10 + struct.unpack("<H", raw[8:10])[0]:]


def descr(raw: bytes) -> str:
    fp = io.BytesIO(raw)
    np.lib.format.read_magic(fp)
    return repr(np.lib.format.dtype_to_descr(np.lib.format.read_array_header_1_0(fp)[2]))


CRAFTS = {
    "1e11 rows": lambda r: npy_head(descr(r), "(100000000000,)") + body(r),
    "empty": lambda r: b"",
    "cut": lambda r: r[: len(r) // 2],
    "object dtype": lambda r: npy_head("'|O'", "(3,)") + bytes(24),
    "zero-size dtype, 10**12 items": lambda r: npy_head("'|V0'", "(1000000000000,)"),
    "negative shape": lambda r: npy_head(descr(r), "(-4,)") + body(r),
    "extra bytes": lambda r: r + bytes(24),
}


def limited(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """The command line in a process of ``LIMIT`` bytes of address space."""
    code = (f"import resource, sys; resource.setrlimit(resource.RLIMIT_AS, ({LIMIT}, {LIMIT})); "
            f"from shardsmith.cli import main; sys.argv = ['shardsmith'] + sys.argv[1:]; main()")
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, timeout=300)


def one_line(res: subprocess.CompletedProcess[str], *, codes: tuple[int, ...] = (1, 2)) -> str:
    text = res.stdout + res.stderr
    assert res.returncode in codes and "Traceback" not in text and "Aborted" not in text, text[-2000:]
    assert len(res.stderr.strip().splitlines()) <= 1, res.stderr
    return text


@pytest.mark.parametrize("craft", list(CRAFTS))
@pytest.mark.parametrize("kind, suffix", [("plain", ".origins.npy"), ("packed", ".origins.npy"), ("packed", ".cu.npy")])
def test_a_sidecar_whose_npy_header_lies_is_one_line_everywhere(made, tmp_path, craft, kind, suffix):
    """``verify``, ``trace`` and ``sources()`` of a dataset whose sidecar lies (and whose manifest agrees
    with it): one line naming the file; 10**11 rows were a MemoryError traceback, an empty file "Aborted!"."""
    out = tmp_path / "ds"
    shutil.copytree(made[kind], out)
    side = sorted(out.glob(f"train-*{suffix}"))[0]
    side.write_bytes(CRAFTS[craft](side.read_bytes()))
    rehash(out)
    for args in (("verify", out), ("trace", out, "0")):
        res = run_cli(*args)
        text = res.output + res.stderr
        assert res.exit_code in (1, 2) and side.name in text and "Aborted" not in text, text
        assert len(res.stderr.strip().splitlines()) <= 1, res.stderr
    with pytest.raises(DatasetError, match=side.name.replace(".", r"\.")) as info:
        ds = PackedSequences(out) if kind == "packed" else shardsmith.TokenDataset(out, seq_len=SEQ)
        ds.sources(0)
    assert "\n" not in str(info.value)


def test_a_header_of_1e11_rows_allocates_nothing(made, tmp_path):
    """The same lie in processes of 2 GB of address space: ``np.load`` allocated the 2.2 TB it claims."""
    out = tmp_path / "ds"
    shutil.copytree(made["plain"], out)
    side = sorted(out.glob("train-*.origins.npy"))[0]
    side.write_bytes(CRAFTS["1e11 rows"](side.read_bytes()))
    rehash(out)
    assert side.name in one_line(limited("trace", out, "0"))


def test_trace_of_an_index_beyond_int64_is_out_of_range(made):
    for index in ("99999999999999999999", str(2**63), str(2**64)):
        res = run_cli("trace", made["plain"], index)
        assert res.exit_code == 2 and "out of range" in res.stderr, res.stderr  # an OverflowError traceback
        assert len(res.stderr.strip().splitlines()) == 1
    ds = shardsmith.TokenDataset(made["plain"], seq_len=SEQ)
    for bad in (2**70, 2**63, -(2**70)):
        with pytest.raises(IndexError, match="out of range"):
            ds.sources(bad)
        with pytest.raises(IndexError, match="out of range"):
            ds.get_batch([0, bad])
    for bad in ([1.5], [True], np.array([0.0])):
        with pytest.raises(IndexError, match="must be integers"):  # was read as window 1 (or 0), silently
            ds.get_batch(bad)
    assert len(ds.get_batch([])[0]) == 0


@pytest.fixture(scope="module")
def states(made: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """What the README's loop saves: a StatefulDataLoader of TokenBatches, with 0 and 2 workers."""
    pytest.importorskip("torchdata")
    from torchdata.stateful_dataloader import StatefulDataLoader

    from shardsmith.torch import TokenBatches

    ds = shardsmith.TokenDataset(made["plain"], seq_len=SEQ)
    saved = {}
    for workers in (0, 2):
        loader = StatefulDataLoader(TokenBatches(ds, batch_size=4, seed=1), batch_size=None, num_workers=workers)
        it = iter(loader)
        for _ in range(3):
            next(it)
        saved[f"w{workers}"] = json.loads(json.dumps({"epoch": 0, "loader": loader.state_dict()}))
        del it
    return saved


def patched(state: dict, **fields) -> dict:
    """``state`` with ``fields`` set in every adapter state inside it."""
    state = json.loads(json.dumps(state))
    stack = [state]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            if value.get("shardsmith"):
                value.update(fields)
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return state


def test_a_state_of_a_billion_workers_is_refused_before_anything_is_built(made, states, tmp_path):
    """``"workers": 10**9`` made ``trace --state`` and ``global_position`` build a list of a billion
    workers (6.8 GB, deaf to Ctrl-C): here, in a 2 GB process, one line."""
    path = tmp_path / "state.json"
    path.write_text(json.dumps(patched(states["w2"], workers=10**9)))
    text = one_line(limited("trace", made["plain"], "--state", path), codes=(2,))
    assert "1000000000 workers" in text, text
    code = (f"import json, resource; resource.setrlimit(resource.RLIMIT_AS, ({LIMIT}, {LIMIT}))\n"
            f"from shardsmith.kit.rank_split import global_position\n"
            f"try:\n    global_position(json.load(open({str(path)!r}))['loader'])\n"
            f"except ValueError as exc:\n    print('refused:', exc)\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and res.stdout.startswith("refused:") and "workers" in res.stdout, res.stderr[-2000:]


@pytest.mark.parametrize("value", [1.5, True, 2.0, "3", None, -1, 10**6])
def test_a_count_that_is_not_a_count_is_refused(made, states, tmp_path, value):
    """``produced`` (batches a worker handed over) a float, a bool, a string, negative, or more than its
    epoch holds: refused by ``trace --state``, ``global_position`` and ``load_state_dict`` alike (a
    float or a bool was taken as its int)."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    from shardsmith.torch import TokenBatches

    for workers in ("w0", "w2"):
        crafted = patched(states[workers], produced=value)
        path = tmp_path / f"{workers}.json"
        path.write_text(json.dumps(crafted))
        res = run_cli("trace", made["plain"], "--state", path)
        assert res.exit_code == 2 and "produced" in res.stderr and len(res.stderr.strip().splitlines()) == 1, \
            res.stderr
        with pytest.raises(ValueError, match="produced"):
            global_position(crafted["loader"])
    ds = shardsmith.TokenDataset(made["plain"], seq_len=SEQ)
    loader = StatefulDataLoader(TokenBatches(ds, batch_size=4, seed=1), batch_size=None, num_workers=0)
    loader.load_state_dict(patched(states["w0"], produced=value)["loader"])
    with pytest.raises(ValueError, match="produced"):
        next(iter(loader))


def test_a_state_nested_deep_or_holding_itself_is_walked_without_recursion(states):
    """A state inside 5,000 lists (a RecursionError) is found; one that holds itself is walked once."""
    want = global_position(states["w2"]["loader"])
    deep: object = states["w2"]["loader"]
    for _ in range(5000):
        deep = [deep]
    assert global_position([deep]) == want
    looped = dict(states["w2"]["loader"])
    looped["self"] = looped
    assert global_position(looped) == want


@pytest.mark.parametrize("change", [{"consumed": {"a": 2**70, "b": 0}}, {"consumed": {"a": 1.5, "b": 0}},
                                    {"consumed": []}, {"lengths": None}, {"lengths": {"a": True}},
                                    {"consumed": {"a": 1, "b": 1, "gone": "x"}}, {"seed": 7.0}, {"shuffle": 1}])
def test_a_crafted_mixture_state_is_one_line(made, change):
    """``mix(start=state)`` with counts that are not counts, or a seed and shuffle of another type (7.0
    and 1 were taken for 7 and True; None was a TypeError, 2**70 an OverflowError later)."""
    from shardsmith.errors import UsageError
    from shardsmith.loader import mix

    ds = shardsmith.TokenDataset(made["plain"], seq_len=SEQ)
    state = {**mix({"a": ds, "b": ds}, {"a": 2, "b": 1}, seed=7).state(10), **change}
    with pytest.raises(UsageError) as info:
        mix({"a": ds, "b": ds}, {"a": 2, "b": 1}, seed=7, start=state)
    assert "\n" not in str(info.value)


def test_a_mixture_length_or_seed_that_is_no_count_is_refused(made, tmp_path):
    from shardsmith.errors import UsageError
    from shardsmith.loader import mix
    from shardsmith.loader.mix_recipe import from_recipe

    ds = shardsmith.TokenDataset(made["plain"], seq_len=SEQ)
    for bad in (2**63, 2**70, True, 1.5, "5"):  # 2**63 was an OverflowError traceback, 1.5 a mixture of 1
        with pytest.raises(UsageError, match="num_samples"):
            mix({"a": ds, "b": ds}, {"a": 1, "b": 1}, seed=0, num_samples=bad)
    with pytest.raises(UsageError, match="seed"):
        mix({"a": ds, "b": ds}, {"a": 1, "b": 1}, seed=1.5)
    for line, word in (("num_samples = 9223372036854775807", "num_samples"), ("seq_len = true", "seq_len"),
                       ("seq_len = 1.5", "seq_len"), ("split = 1", "split")):
        recipe = tmp_path / "mix.toml"
        recipe.write_text(f'[mix]\nseed = 0\n{line if word == "num_samples" else ""}\n'
                          f'[mix.sources.a]\npath = "{made["plain"]}"\nweight = 1\nloader = "TokenDataset"\n'
                          f'{line if word != "num_samples" else ""}\n')
        with pytest.raises(UsageError, match=word):
            from_recipe(recipe)


# -- verify without --deep reads every index; a manifest's records are typed -------------------------

@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from conftest import jpeg_folder

    root = tmp_path_factory.mktemp("crafted-tars")
    res = run_cli("convert", jpeg_folder(root / "in", classes=2, per_class=5), "--to", "webdataset", "-o",
                  root / "out", "--shard-samples", "4", "-q")
    assert res.exit_code == 0, res.stderr
    return root / "out"


def _idx_claims_more(raw: bytes) -> bytes:
    return raw[:18] + struct.pack("<QQ", 10**11, 10**11) + raw[34:]


def _wids_count_true(raw: bytes) -> bytes:
    index = json.loads(raw)
    index["shardlist"][0]["nsamples"] = True if index["shardlist"][0]["nsamples"] == 1 else 1.0 * 4
    return json.dumps(index).encode()


@pytest.mark.parametrize("kind, pattern, craft", [
    ("plain", "train-*.idx", _idx_claims_more), ("plain", "train-*.idx", lambda r: b""),
    ("images", "__index__/train-*.offsets.npy", CRAFTS["1e11 rows"]),
    ("images", "__index__/train-*.offsets.npy", lambda r: r[: len(r) // 2]),
    ("images", "__index__/train.wids.json", _wids_count_true)])
def test_verify_reads_every_index_without_deep(made, images, tmp_path, kind, pattern, craft):
    """An index that lies, under a manifest made to agree with it: ``verify`` said OK (only ``--deep``
    and the loader read the indexes)."""
    out = tmp_path / "ds"
    shutil.copytree(images if kind == "images" else made[kind], out)
    target = sorted(out.glob(pattern))[0]
    target.write_bytes(craft(target.read_bytes()))
    rehash(out)
    res = run_cli("verify", out)
    assert res.exit_code == 1 and target.name in res.output, res.output


@pytest.mark.parametrize("path, value, words", [
    (("splits", "train", "shards", 0, "tokens"), 7, "tokens of"),
    (("splits", "train", "tokens"), 5, "its shards hold"),
    (("cleaning", "removed", "tokens"), "7", "cleaning.removed.tokens"),
    (("source", "input_sizes", 0), 1.5, "input_sizes"),
    (("schema", "tokens", "ragged"), 1, "schema.tokens.ragged"),
    (("tokenizer", "trained"), "yes", "tokenizer.trained"),
])
def test_a_manifest_record_of_the_wrong_type_or_sum_is_refused(made, tmp_path, path, value, words):
    out = tmp_path / "ds"
    shutil.copytree(made["plain"], out)
    m = json.loads((out / "manifest.json").read_text())
    node = m
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    (out / "manifest.json").write_text(json.dumps(m))
    res = run_cli("verify", out)
    assert res.exit_code == 1 and words in res.output, res.output
    with pytest.raises(DatasetError, match=words.replace(".", r"\.")):
        shardsmith.open(out)


def test_a_packed_manifest_records_shares_and_counts(made, tmp_path):
    for key, value in (("padding_fraction", 1.5), ("documents_split", -1), ("sequences", True)):
        out = tmp_path / key
        shutil.copytree(made["packed"], out)
        m = json.loads((out / "manifest.json").read_text())
        m["packing"][key] = value
        (out / "manifest.json").write_text(json.dumps(m))
        res = run_cli("verify", out)
        assert res.exit_code == 1 and f"packing.{key}" in res.output, res.output


@pytest.mark.parametrize("key, value", [("events", "7"), ("events", 49), ("truncated_events", True),
                                        ("max_len", 5), ("pad_value", "0"), ("keep", 3)])
def test_a_memmap_description_that_lies_is_refused(tmp_path, key, value):
    """``{split}.memmap.json``'s own numbers (under a manifest made to agree with the file): the events it
    counts, how many were truncated, the row length, the padding value."""
    pytest.importorskip("uproot")
    from shardsmith.demo.root_files import make_icecube_like

    out = tmp_path / "mm"
    root = make_icecube_like(tmp_path / "run.root", events=50, mean_pulses=4, seed=0)
    assert run_cli("convert", root, "-o", out, "--to", "memmap", "--max-len", "4", "-q").exit_code == 0
    meta = json.loads((out / "train.memmap.json").read_text())
    meta[key] = value
    (out / "train.memmap.json").write_text(json.dumps(meta))
    rehash(out)
    res = run_cli("verify", out)
    assert res.exit_code == 1 and "train.memmap.json" in res.output, res.output
    with pytest.raises(DatasetError, match="memmap.json"):
        shardsmith.open(out)
