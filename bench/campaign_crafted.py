"""Crafted sidecars, states and manifest numbers (issue 42, item 9): what the readers do with files
that lie. Not a benchmark of speed: a count of outcomes, one run.

    python bench/campaign_crafted.py [--random 3] [--jobs 2] [--memory 4GB] [--timeout 120]
                                     [--workdir /tmp/shardsmith-crafted] [--seed 42] [--only NAMES]

Small datasets are made here (tokens with ``--provenance``, plain and packed; images and JSONL rows
in tars; HDF5 and memmap events), and loader states saved by real loaders (``StatefulDataLoader``
over ``TokenBatches``, ``PackedBatches`` and ``EpochBatchSampler`` with 0 and 2 workers; the numpy
``iter()``; a mixture's ``state(n)``) and a ``[mix]`` recipe. Each trial copies one of them, crafts
one file (targeted: a ``.npy`` header claiming 10**11 rows, a negative or zero-size shape, an object
or wrong dtype, a Fortran order, an unknown version, truncated, empty; a Megatron ``.idx`` header
claiming more than it holds; a number of a manifest, wids index, memmap description, state or
recipe replaced by a huge, negative, boolean, float, NaN, null or string value; a billion workers;
a state nested 900 deep; plus ``--random`` byte flips and cuts), then runs every reader of that
file in its own process under a memory limit (``RLIMIT_AS``) and a wall-clock guard: ``verify`` (and
``--deep``), ``inspect``, ``trace`` (an index, ``--state``), ``run`` (a recipe), and the API
(``shardsmith.open``, ``sources()``, ``StatefulDataLoader.load_state_dict`` then a batch,
``global_position``, ``iter().load_state_dict``, ``mix(start=)``, ``from_recipe``). A sidecar is
crafted twice: as it is (the manifest's size and sha256 then refuse it) and with the manifest made
to agree with it (so the lie reaches the reader). Of a loader state, the numbers of shardsmith's
adapter and sampler states are crafted, and the two beside them that ``trace`` reads (the loop's
``epoch``, torchdata's ``_steps_since_snapshot``); torchdata's own fields are torchdata's to check.

Each run is sorted:

- ``ok``: exit 0 on a crafted file that tells no lie (a random flip of data bytes under a manifest
  that agrees, a number changed to another that is possible: any count where a count is a free
  record or choice, the other bool, a positive weight);
- ``one line``: refused: exit 1 or 2 with one line on stderr and no traceback (click's refusal of
  an argument: its usage, hint and one error line); the API raised DatasetError, ValueError or
  IndexError with a one-line message (a DataLoader worker's, as torch re-raises it: its last line);
- ``silent lie``: exit 0 although the file told an impossible number (a type, a bound, a size);
- ``traceback``, ``crash (SIG...)``, ``hang`` (past ``--timeout``), ``memory`` (a MemoryError or
  ``bad_alloc`` under the address-space limit). The goal is zero of these four and zero silent lies.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import dataclasses
import hashlib
import io
import json
import os
import random
import resource
import shutil
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PY = sys.executable
SEQ = 16
DOC_ORIGIN = "[('file', '<u4'), ('hash', '<u4'), ('record', '<u8'), ('offset', '<i8')]"

# -- the API probes: each runs in its own process; a refusal is exit 3 with its one line -----------

PROBE = r'''
import json, sys
kind, out, arg = sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else ""
workers = int(sys.argv[4]) if len(sys.argv) > 4 else 0  # the loader's, as it saved the state
from shardsmith.errors import ShardsmithError
try:
    import shardsmith
    import shardsmith.loader
    if kind == "open":                       # any dataset: open, len, an item, the sources of a window
        ds = shardsmith.open(out, split="train")
        n = len(ds)
        if n:
            ds[0]; ds[n - 1]
        if hasattr(ds, "sources") and n:
            ds.sources(0)
        tok = json.load(open(out + "/manifest.json")).get("format") == "tokens"
        if tok and not json.load(open(out + "/manifest.json")).get("packing"):
            w = shardsmith.TokenDataset(out, seq_len=@SEQ@)
            w.sources(0); w.sources(len(w) - 1); w.get_batch([0, len(w) - 1])
    elif kind == "sources":                  # trace's own entry: sources of window (or sequence) arg
        ds = shardsmith.open(out, split="train")
        packed = json.load(open(out + "/manifest.json")).get("packing")
        ds = ds if packed else shardsmith.TokenDataset(out, seq_len=@SEQ@)
        ds.sources(int(arg))
    elif kind in ("loader", "sampler", "packed-loader"):  # a StatefulDataLoader state, loaded, then a batch
        from torchdata.stateful_dataloader import StatefulDataLoader
        from shardsmith.torch import EpochBatchSampler, PackedBatches, TokenBatches, TokenWindows
        saved = json.load(open(arg))
        if kind == "packed-loader":
            ds = shardsmith.loader.PackedSequences(out)
            loader = StatefulDataLoader(PackedBatches(ds, batch_size=3, seed=2), batch_size=None, num_workers=workers)
        elif kind == "loader":
            ds = shardsmith.TokenDataset(out, seq_len=@SEQ@)
            loader = StatefulDataLoader(TokenBatches(ds, batch_size=4, seed=1), batch_size=None, num_workers=workers)
        else:
            ds = shardsmith.TokenDataset(out, seq_len=@SEQ@)
            loader = StatefulDataLoader(TokenWindows(ds), num_workers=workers,
                                        batch_sampler=EpochBatchSampler(ds, batch_size=5, seed=3))
        loader.load_state_dict(saved["loader"])
        for _ in zip(range(2), loader):
            pass
    elif kind == "position":                 # global_position of a state, then an adapter started there
        from shardsmith.torch import TokenBatches, global_position
        saved = json.load(open(arg))
        pos = global_position(saved["loader"] if isinstance(saved, dict) else saved)
        ds = shardsmith.TokenDataset(out, seq_len=@SEQ@)
        next(iter(TokenBatches(ds, batch_size=4, seed=1, start=pos)), None)
    elif kind == "iter":                     # the numpy iterator's state
        ds = shardsmith.TokenDataset(out, seq_len=@SEQ@)
        it = ds.iter(seed=5, batch_size=4)
        it.load_state_dict(json.load(open(arg)))
        next(it, None)
    elif kind == "mix":                      # a mixture continued from a saved state(n)
        from shardsmith.loader import mix
        a = shardsmith.TokenDataset(out, seq_len=@SEQ@, split="train")
        b = shardsmith.TokenDataset(out, seq_len=@SEQ@, split="val")
        m = mix({"a": a, "b": b}, {"a": 2, "b": 1}, seed=7, start=json.load(open(arg)))
        if len(m):
            m[0]; m.get_batch(list(range(min(4, len(m)))))
    elif kind == "recipe":
        from shardsmith.loader.mix_recipe import from_recipe
        m = from_recipe(arg)
        if len(m):
            m[0]; m[len(m) - 1]
except (ShardsmithError, ValueError, IndexError) as exc:
    message = str(exc)
    if "in DataLoader worker process" in message:  # torch re-raises a worker's error with its traceback:
        message = message.strip().splitlines()[-1]  # the last line is the worker's own "ValueError: ..."
    print(f"refused: {type(exc).__name__}: {message}", file=sys.stderr)
    sys.exit(3 if message and "\n" not in message else 4)
'''.replace("@SEQ@", str(SEQ))


# -- making the datasets and the states ------------------------------------------------------------

def cli(*args: Any, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "shardsmith", *map(str, args)], capture_output=True, text=True, check=check,
                          timeout=600)


def make_datasets(work: Path) -> dict[str, Path]:
    """Small datasets of every kind whose sidecars are crafted (a second or two each)."""
    sys.path.insert(0, str(ROOT))
    from shardsmith.demo.root_files import make_icecube_like

    corpus = work / "corpus"
    corpus.mkdir(parents=True)
    rng = random.Random(0)
    words = ["alpha", "beta", "gamma", "delta", "shard", "token", "café", "naïve"]
    with open(corpus / "a.jsonl", "w", encoding="utf-8") as fh:
        for i in range(300):
            row = {"id": i, "text": " ".join(rng.choice(words) for _ in range(rng.randint(3, 30))),
                   "score": rng.random(), "tiny": 1.5e-12 * i, "big": 2**60 + i}
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    root = make_icecube_like(work / "events.root", events=400, mean_pulses=6, seed=0)
    made = {
        "tokens": ["pack-tokens", corpus, "--train-tokenizer", "400", "--provenance", "--seq-len", SEQ,
                   "--shard-tokens", "1K", "--split", "train=0.8,val=0.2"],
        "rows": ["convert", corpus, "--to", "webdataset", "--text-field", "text", "--shard-samples", "100"],
        "images": ["convert", ROOT / "examples" / "images", "--to", "webdataset", "--shard-samples", "8"],
        "hdf5": ["convert", root, "--to", "hdf5", "--shard-samples", "150"],
        "memmap": ["convert", root, "--to", "memmap", "--max-len", "8"],
    }
    out = {}
    for name, args in made.items():
        out[name] = work / "made" / name
        cli(*args[:2], "-o", out[name], *args[2:], "-q")
    out["packed"] = work / "made" / "packed"
    cli("pack-tokens", corpus, "-o", out["packed"], "--tokenizer", out["tokens"] / "tokenizer.json", "--provenance",
        "--seq-len", SEQ, "--shard-tokens", "1K", "--pack", "best-fit", "--pack-window", "256", "-q")
    return out


STATES = r'''
import json, sys
from pathlib import Path
import shardsmith
import shardsmith.loader
from torchdata.stateful_dataloader import StatefulDataLoader
from shardsmith.loader import mix
from shardsmith.torch import EpochBatchSampler, PackedBatches, TokenBatches, TokenWindows
tokens, packed, dest = sys.argv[1], sys.argv[2], Path(sys.argv[3])
ds = shardsmith.TokenDataset(tokens, seq_len=@SEQ@)
ps = shardsmith.loader.PackedSequences(packed)
def save(name, make, take):
    loader = make()
    it = iter(loader)
    for _ in range(take):
        next(it)
    (dest / f"{name}.json").write_text(json.dumps({"epoch": 0, "loader": loader.state_dict()}))
    del it
for workers in (0, 2):
    save(f"loader-w{workers}", lambda: StatefulDataLoader(TokenBatches(ds, batch_size=4, seed=1), batch_size=None,
                                                           num_workers=workers), 3)
    save(f"packed-w{workers}", lambda: StatefulDataLoader(PackedBatches(ps, batch_size=3, seed=2), batch_size=None,
                                                           num_workers=workers), 2)
    save(f"sampler-w{workers}", lambda: StatefulDataLoader(
        TokenWindows(ds), num_workers=workers, batch_sampler=EpochBatchSampler(ds, batch_size=5, seed=3)), 2)
it = ds.iter(seed=5, batch_size=4)
next(it); next(it)
(dest / "iter.json").write_text(json.dumps(it.state_dict()))
m = mix({"a": ds, "b": shardsmith.TokenDataset(tokens, seq_len=@SEQ@, split="val")}, {"a": 2, "b": 1}, seed=7)
(dest / "mix.json").write_text(json.dumps(m.state(len(m) // 2)))
(dest / "recipe.toml").write_text(
    "[mix]\nseed = 7\nnum_samples = 50\n"
    f'[mix.sources.web]\npath = "{tokens}"\nweight = 0.5\nsplit = "train"\nloader = "TokenDataset"\nseq_len = @SEQ@\n'
    f'[mix.sources.val]\npath = "{tokens}"\nweight = 0.5\nsplit = "val"\nloader = "TokenDataset"\nseq_len = @SEQ@\n')
'''.replace("@SEQ@", str(SEQ))


def make_states(work: Path, made: dict[str, Path]) -> Path:
    dest = work / "states"
    dest.mkdir()
    subprocess.run([PY, "-c", STATES, made["tokens"], made["packed"], dest], check=True, timeout=600)
    return dest


# -- what is crafted ------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Craft:
    """One crafted file: ``make(original bytes) -> new bytes``; ``lie``: the file now tells something
    impossible (a reader of it must refuse it); ``only``: the target's readers that read what it
    changes (a loop's own epoch beside a loader state is read by ``trace`` alone)."""

    name: str
    make: Callable[[bytes], bytes]
    lie: bool = True
    only: frozenset[str] | None = None  # the readers of what it changes (None: all the target's)


def npy_head(descr: str, shape: Any, *, fortran: bool = False, version: int = 1) -> bytes:
    header = f"{{'descr': {descr}, 'fortran_order': {fortran}, 'shape': {shape}, }}"
    pad = -(10 + len(header) + 1) % 64
    text = (header + " " * pad + "\n").encode("latin1")
    return b"\x93NUMPY" + bytes([version, 0]) + struct.pack("<H", len(text)) + text


def npy_body(raw: bytes) -> bytes:
    return raw[10 + struct.unpack("<H", raw[8:10])[0]:]


def _descr(raw: bytes) -> str:
    fp = io.BytesIO(raw)
    np.lib.format.read_magic(fp)
    return repr(np.lib.format.dtype_to_descr(np.lib.format.read_array_header_1_0(fp)[2]))


def npy_crafts() -> list[Craft]:
    """A .npy sidecar whose header lies (or that is not one at all)."""
    return [
        Craft("rows 1e11", lambda r: npy_head(_descr(r), "(100000000000,)") + npy_body(r)),
        Craft("rows 2**62", lambda r: npy_head(_descr(r), "(4611686018427387904,)") + npy_body(r)),
        Craft("rows negative", lambda r: npy_head(_descr(r), "(-5,)") + npy_body(r)),
        Craft("shape 2-d huge", lambda r: npy_head(_descr(r), "(1000000, 1000000)") + npy_body(r)),
        Craft("dtype object", lambda r: npy_head("'|O'", "(3,)") + b"\0" * 24),
        Craft("dtype V0 huge", lambda r: npy_head("'|V0'", "(1000000000000,)")),
        Craft("dtype float", lambda r: npy_head("'<f8'", f"({len(npy_body(r)) // 8},)")
              + npy_body(r)[:len(npy_body(r)) // 8 * 8]),
        Craft("fortran order", lambda r: npy_head(_descr(r), f"(1, {max(1, len(npy_body(r)) // 24)})", fortran=True)
              + npy_body(r)),
        Craft("version 3", lambda r: r[:6] + b"\x03\x00" + r[8:]),
        Craft("truncated", lambda r: r[: len(r) // 2]),
        Craft("header only", lambda r: r[: 10 + struct.unpack("<H", r[8:10])[0]]),
        Craft("empty", lambda r: b""),
        Craft("extra bytes", lambda r: r + b"\0" * 24),
        Craft("not npy", lambda r: b"PK\x03\x04" + r[4:]),
    ]


def idx_crafts() -> list[Craft]:
    """A Megatron .idx whose header claims more than it holds."""
    def head(seqs: int, docs: int) -> Callable[[bytes], bytes]:
        return lambda r: r[:18] + struct.pack("<QQ", seqs, docs) + r[34:]

    return [Craft("seqs 1e11", head(10**11, 10**11)), Craft("seqs 2**63", head(2**63, 1)),
            Craft("docs 0", head(3, 0)), Craft("truncated", lambda r: r[: len(r) // 2]),
            Craft("empty", lambda r: b""), Craft("dtype code 99", lambda r: r[:17] + b"\x63" + r[18:])]


BAD_VALUES = [10**11, 2**62, 2**63, 2**64 + 1, 10**30, -1, -(2**63), True, False, 1.5, 1e308, float("nan"),
              float("inf"), None, "7", [], {}]


def json_paths(value: Any, prefix: tuple = (), *, inside: Callable[[tuple], bool] | None = None) -> list[tuple]:
    """Every path to a number or bool in a JSON value (lists: every item, up to 4); ``inside``: only
    the paths it accepts."""
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in json_paths(v, (*prefix, k), inside=inside)]
    if isinstance(value, list):
        return [p for i, v in enumerate(value[:4]) for p in json_paths(v, (*prefix, i), inside=inside)]
    ok = isinstance(value, (int, float)) and prefix and (inside is None or inside(prefix))
    return [prefix] if ok else []


def get_path(doc: Any, path: tuple) -> Any:
    for k in path:
        doc = doc[k]
    return doc


def set_path(doc: Any, path: tuple, value: Any) -> Any:
    node = doc
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    return doc


def dumps(doc: Any) -> bytes:
    return json.dumps(doc).encode()  # NaN and Infinity as Python writes them (not JSON: the reader says so)


POSSIBLE = {"batch_size": (None,)}  # values a field may hold beside its type's (a state without batches)


def json_crafts(raw: bytes, rng: random.Random, *, count: int, free: frozenset[str] = frozenset(),
                inside: Callable[[tuple], bool] | None = None,
                readers: Callable[[tuple], frozenset[str] | None] = lambda path: None) -> list[Craft]:
    """``count`` numbers of a JSON file replaced by impossible values, and the file cut or emptied.
    ``free``: keys whose value is a free choice (another count is no lie: only a type is; another
    bool never is); ``inside``: the paths that may be crafted (all numbers); ``readers``: who reads
    a path (None: every reader of the file)."""
    doc = json.loads(raw)
    paths = json_paths(doc, inside=inside)
    crafts = [Craft("truncated", lambda r: r[: len(r) // 2]), Craft("empty", lambda r: b"")]
    for path in rng.sample(paths, min(count, len(paths))):
        was = get_path(doc, path)
        value = rng.choice([v for v in BAD_VALUES if not (type(v) is type(was) and v == was)])
        names = [str(k) for k in path if not isinstance(k, int)]  # a list's item goes by its list's name
        named = names[-1] in free or ".".join(names[-2:]) in free
        possible = (named and type(value) is int and value >= 0) or (type(value) is bool and type(was) is bool) \
            or value in POSSIBLE.get(names[-1], ())
        crafts.append(Craft(f"{'.'.join(map(str, path))}={value!r}",
                            lambda r, p=path, v=value: dumps(set_path(json.loads(r), p, v)), lie=not possible,
                            only=readers(path)))
    return crafts


def deep_state(raw: bytes) -> bytes:
    """A state nested 900 lists deep around the real one (a recursive walk of it overflows Python's
    stack; the JSON readers take up to about a thousand levels)."""
    return b"[" * 900 + raw + b"]" * 900


def random_crafts(rng: random.Random, count: int, *, data_start: Callable[[bytes], int]) -> list[Craft]:
    """Byte flips in the data (no lie: the manifest agrees) and in the header, and random cuts."""
    out = []
    for k in range(count):
        seed = rng.randrange(1 << 30)
        kind = ("flip data", "flip header", "cut")[k % 3]

        def make(r: bytes, seed: int = seed, kind: str = kind) -> bytes:
            g = random.Random(seed)
            b = bytearray(r)
            if not b:
                return bytes(b)
            lo = data_start(r) if kind == "flip data" else 0
            hi = len(b) if kind == "flip data" else max(1, data_start(r))
            if kind == "cut":
                return bytes(b[: g.randrange(len(b))])
            for _ in range(g.randint(1, 4)):
                if lo < hi:
                    b[g.randrange(lo, hi)] = g.randrange(256)
            return bytes(b)

        out.append(Craft(f"random {kind} #{k}", make, lie=kind != "flip data"))
    return out


# -- running and sorting -----------------------------------------------------------------------------

@dataclasses.dataclass
class Outcome:
    kind: str
    detail: str


def limited(memory: int) -> Callable[[], None]:
    def preexec() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        os.setsid()

    return preexec


def run(argv: list[str], *, memory: int, timeout: float, lie: bool, api: bool) -> Outcome:
    """Run one reader under the limits and sort what it did."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=limited(memory), cwd=ROOT)
    t0 = time.monotonic()
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return Outcome("hang", f"past {timeout:.0f} s")
    code = proc.returncode
    lines = [line for line in err.strip().splitlines() if line.strip()]
    del t0
    if "MemoryError" in err or "bad_alloc" in err or "Cannot allocate memory" in err:
        return Outcome("memory", err[-600:])
    if code < 0:
        return Outcome(f"crash ({signal.Signals(-code).name})", err[-600:])
    if "Traceback" in err or (api and code not in (0, 3)):
        return Outcome("traceback", err[-1200:])
    if code == 0:
        return Outcome("silent lie" if lie else "ok", out[-300:])
    if not api and code == 2 and lines[:1] and lines[0].startswith("Usage:") and lines[-1].startswith("Error:"):
        return Outcome("one line", lines[-1])  # click's refusal of an argument: usage, hint, the one error line
    if (code == 3 if api else code in (1, 2)) and len(lines) <= 1:
        return Outcome("one line", lines[0] if lines else out.strip().splitlines()[-1:][0] if out.strip() else "")
    return Outcome(f"other (exit {code}, {len(lines)} lines)", err[-600:])


def rehash(out: Path) -> None:
    """Make the manifest agree with the files as they are now (every entry's bytes and sha256)."""
    path = out / "manifest.json"
    try:
        m = json.loads(path.read_text())
    except ValueError:
        return

    def fix(entry: Any) -> None:
        if isinstance(entry, dict) and isinstance(entry.get("path"), str) and "sha256" in entry:
            f = out / entry["path"]
            if f.is_file():
                data = f.read_bytes()
                entry["bytes"], entry["sha256"] = len(data), hashlib.sha256(data).hexdigest()

    for split in m.get("splits", {}).values():
        for shard in split.get("shards", []):
            fix(shard)
            for value in shard.values():
                fix(value)
                if isinstance(value, dict):
                    for inner in value.values():
                        fix(inner)
    for entry in m.get("files") or []:
        fix(entry)
    path.write_text(json.dumps(m))


@dataclasses.dataclass(frozen=True)
class Target:
    """A file of a dataset (or a state) and the readers that read it.

    ``dataset``: which made dataset it belongs to; ``file``: its path in it (a state: under states/);
    ``readers``: what reads it; ``sidecar``: listed in the manifest (crafted both as it is and with
    the manifest made to agree)."""

    name: str
    dataset: str
    file: str
    crafts: list[Craft]
    readers: list[Reader]
    sidecar: bool = True


@dataclasses.dataclass(frozen=True)
class Reader:
    """A command or API probe (argv with {out}, {file}, {index}); ``strict``: it reads the crafted file
    whole every time (a command that reads a sample of the shards, as inspect, may never meet it:
    its exit 0 is no silent lie)."""

    name: str
    argv: list[str]
    strict: bool = True


def cli_argv(name: str, *args: str, strict: bool = True) -> Reader:
    return Reader(name, [PY, "-m", "shardsmith", *args], strict)


def probe_argv(name: str, kind: str, *rest: str) -> Reader:
    return Reader(name, [PY, "-c", PROBE, kind, "{out}", *rest])


def targets(made: dict[str, Path], states: Path, rng: random.Random, *, random_count: int) -> list[Target]:
    def first(name: str, pattern: str) -> str:
        return sorted(p.relative_to(made[name]).as_posix() for p in made[name].glob(pattern))[0]

    npy = npy_crafts()

    def npy_start(r: bytes) -> int:
        return 10 + struct.unpack("<H", r[8:10])[0] if len(r) >= 10 else 0

    verify = [cli_argv("verify", "verify", "{out}"), cli_argv("verify --deep", "verify", "{out}", "--deep")]
    inspect = cli_argv("inspect", "inspect", "{out}", strict=False)
    tok_readers = [*verify, cli_argv("trace", "trace", "{out}", "0"), probe_argv("api open/sources", "open")]
    tar_readers = [*verify, inspect, probe_argv("api open", "open")]
    out = [
        Target("origins.npy", "tokens", first("tokens", "train-*.origins.npy"),
               npy + random_crafts(rng, random_count, data_start=npy_start), tok_readers),
        Target("packed origins.npy", "packed", first("packed", "train-*.origins.npy"),
               npy + random_crafts(rng, random_count, data_start=npy_start), tok_readers),
        Target("packed .cu.npy", "packed", first("packed", "train-*.cu.npy"),
               npy + random_crafts(rng, random_count, data_start=npy_start),
               [*tok_readers, inspect]),
        Target(".idx", "tokens", first("tokens", "train-*.idx"),
               idx_crafts() + random_crafts(rng, random_count, data_start=lambda r: 34),
               [*tok_readers, inspect]),
        Target("tar offsets.npy", "images", first("images", "__index__/train-*.offsets.npy"),
               npy + random_crafts(rng, random_count, data_start=npy_start), tar_readers),
        Target("wids.json", "rows", "__index__/train.wids.json",
               json_crafts((made["rows"] / "__index__/train.wids.json").read_bytes(), rng, count=8),
               verify[:1]),
        Target("memmap.json", "memmap", "train.memmap.json",
               json_crafts((made["memmap"] / "train.memmap.json").read_bytes(), rng, count=10,
                           free=frozenset({"pad_value"})), tar_readers),
    ]
    # numbers a manifest may hold any count in (a record of the run, or a choice that bounds nothing):
    # another count is no lie, only another type is
    free = frozenset({"seed", "vocab_size", "vocab_size_asked", "eos_id", "bos_id", "pad_id", "seq_len", "records",
                      "input_bytes", "input_sizes", "count", "max_image_pixels", "copies", "shard_samples",
                      "shard_bytes", "window_tokens", "sequences", "real_tokens", "padding_tokens", "documents",
                      "documents_split", "removed.tokens", "removed.documents", "format_options.max_len"})
    for name in ("tokens", "packed", "rows", "hdf5", "memmap"):
        raw = (made[name] / "manifest.json").read_bytes()
        readers = tok_readers if name in ("tokens", "packed") else tar_readers
        out.append(Target(f"{name} manifest", name, "manifest.json",
                          json_crafts(raw, rng, count=14, free=free), readers, sidecar=False))
    # a loader state: the numbers of shardsmith's adapter states in it, and the two of the README's loop
    # and of torchdata that ``trace`` reads (torchdata's own fields are torchdata's to check)
    state_free = frozenset({"seed", "epoch"})

    def ours(path: tuple) -> bool:
        return path[-1] in ("epoch", "_steps_since_snapshot") and len(path) <= 2 or any(
            k in ("dataset_state", "_index_sampler_state") for k in path)

    for state, kind, dataset in (("loader-w0", "loader", "tokens"), ("loader-w2", "position", "tokens"),
                                 ("packed-w0", "packed-loader", "packed"), ("packed-w2", "packed-loader", "packed"),
                                 ("sampler-w0", "sampler", "tokens"), ("sampler-w2", "sampler", "tokens")):
        raw = (states / f"{state}.json").read_bytes()
        def readers(path: tuple) -> frozenset[str] | None:
            if path == ("epoch",):  # the loop's own epoch: trace alone reads it
                return frozenset({"trace --state"})
            if path[-1] == "_steps_since_snapshot":  # torchdata's: trace and global_position read it too
                return frozenset({"trace --state", "api position"})
            return None

        crafts = json_crafts(raw, rng, count=14, free=state_free, inside=ours, readers=readers)
        # the state found where it is, inside 900 lists (no lie: a walk must find it, without recursion)
        crafts.append(Craft("nested 900 deep", deep_state, lie=False,
                            only=frozenset({"trace --state", "api position"})))
        crafts.append(Craft("workers=10**9", lambda r: _every_state(r, "workers", 10**9)))
        crafts.append(Craft("produced=1.5", lambda r: _every_state(r, "produced", 1.5)))
        crafts.append(Craft("produced=true", lambda r: _every_state(r, "produced", True)))
        workers = state.rsplit("-w", 1)[1]
        readers = [cli_argv("trace --state", "trace", "{out}", "--state", "{file}"),
                   probe_argv(f"api {kind}", kind, "{file}", workers)]
        if kind != "position" and dataset == "tokens":
            readers.append(probe_argv("api position", "position", "{file}"))
        out.append(Target(f"state {state}", dataset, f"states/{state}.json", crafts, readers, sidecar=False))
    out.append(Target("iter state", "tokens", "states/iter.json",
                      json_crafts((states / "iter.json").read_bytes(), rng, count=10, free=frozenset({"seed"})),
                      [probe_argv("api iter", "iter", "{file}")], sidecar=False))
    out.append(Target("mix state", "tokens", "states/mix.json",
                      json_crafts((states / "mix.json").read_bytes(), rng, count=10),
                      [probe_argv("api mix", "mix", "{file}")], sidecar=False))
    out.append(Target("mix recipe", "tokens", "states/recipe.toml", recipe_crafts(),
                      [cli_argv("run", "run", "{file}"), probe_argv("api from_recipe", "recipe", "{file}")],
                      sidecar=False))
    out.append(Target("trace INDEX", "tokens", "", [Craft(f"index {v}", lambda r: r) for v in
                                                   ("99999999999999999999", "18446744073709551616",
                                                    "9223372036854775807", "1e3", "0x10")],
                      [cli_argv("trace", "trace", "{out}", "{index}"), probe_argv("api sources", "sources", "{index}")],
                      sidecar=False))
    return out


def _every_state(raw: bytes, key: str, value: Any) -> bytes:
    doc = json.loads(raw)
    stack = [doc]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            if v.get("shardsmith"):
                v[key] = value
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return dumps(doc)


def recipe_crafts() -> list[Craft]:
    """The ``[mix]`` recipe's numbers replaced (TOML has inf and nan; ints are 64-bit)."""
    def sub(old: str, new: str) -> Callable[[bytes], bytes]:
        return lambda r: r.replace(old.encode(), new.encode(), 1)

    crafts = []
    for value in ("9223372036854775807", "-1", "true", "1.5", "nan", "inf", "1e308", '"7"', "[]"):
        number = value not in ("true", '"7"', "[]")
        crafts.append(Craft(f"num_samples={value}", sub("num_samples = 50", f"num_samples = {value}")))
        crafts.append(Craft(f"seq_len={value}", sub(f"seq_len = {SEQ}", f"seq_len = {value}")))
        # any positive finite weight is one (weights are shares), any integer a seed: no lie
        crafts.append(Craft(f"weight={value}", sub("weight = 0.5", f"weight = {value}"),
                            lie=not (number and value not in ("-1", "nan", "inf"))))
        crafts.append(Craft(f"seed={value}", sub("seed = 7", f"seed = {value}"),
                            lie=value not in ("9223372036854775807", "-1")))
    crafts.append(Craft("split=1", sub('split = "train"', "split = 1")))
    crafts.append(Craft("empty", lambda r: b""))
    return crafts


def trial(target: Target, craft: Craft, *, rehashed: bool, made: dict[str, Path], states: Path, work: Path,
          memory: int, timeout: float, seq: int) -> list[tuple[str, Outcome]]:
    """One crafted copy and every reader of it."""
    where = work / "trials" / f"t{seq}"
    out = where / target.dataset
    shutil.copytree(made[target.dataset], out)
    file = ""
    index = "0"
    if target.name == "trace INDEX":
        index = craft.name.split(" ", 1)[1]
    elif target.file.startswith("states/"):
        src = states / target.file.split("/", 1)[1]
        dst = where / src.name
        raw = src.read_bytes()
        dst.write_bytes(craft.make(raw) if src.suffix != ".toml" else
                        craft.make(raw.replace(str(made["tokens"]).encode(), str(out).encode())))
        file = str(dst)
    else:
        path = out / target.file
        path.write_bytes(craft.make(path.read_bytes()))
        if rehashed:
            rehash(out)
    results = []
    for reader in target.readers:
        if craft.only is not None and reader.name not in craft.only:
            continue
        args = [a.replace("{out}", str(out)).replace("{file}", file).replace("{index}", index) for a in reader.argv]
        # a sidecar changed under the manifest's sha256 is a lie to verify, whatever the change; the loader
        # checks sizes, not hashes (verify's job), so to it only an impossible file is one
        lie = craft.lie or (target.sidecar and not rehashed and reader.name.startswith("verify"))
        results.append((reader.name, run(args, memory=memory, timeout=timeout, lie=lie and reader.strict,
                                         api=reader.name.startswith("api"))))
    shutil.rmtree(where, ignore_errors=True)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--random", type=int, default=6, help="random byte crafts per sidecar (beside the targeted ones)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--memory", default="4GB", help="address-space limit of each reader (RLIMIT_AS)")
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/shardsmith-crafted"))
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--only", default="", help="comma-separated target names (default: all)")
    ap.add_argument("--reuse", action="store_true", help="keep the datasets and states of an earlier run in --workdir")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from shardsmith.core.sizes import parse_size

    memory = parse_size(args.memory, option="--memory")
    t0 = time.perf_counter()
    if args.reuse and (args.workdir / "states" / "recipe.toml").is_file():
        made = {p.name: p for p in (args.workdir / "made").iterdir()}
        states = args.workdir / "states"
        shutil.rmtree(args.workdir / "trials", ignore_errors=True)
    else:
        shutil.rmtree(args.workdir, ignore_errors=True)
        args.workdir.mkdir(parents=True)
        made = make_datasets(args.workdir)
        states = make_states(args.workdir, made)
    print(f"made {len(made)} datasets and {len(list(states.iterdir()))} states in {time.perf_counter() - t0:.0f} s",
          flush=True)
    rng = random.Random(args.seed)
    chosen = [t for t in targets(made, states, rng, random_count=args.random)
              if not args.only or t.name in args.only.split(",")]
    jobs = [(t, c, rehashed) for t in chosen for c in t.crafts
            for rehashed in ((False, True) if t.sidecar else (False,))]
    table: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    examples: dict[str, str] = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = {pool.submit(trial, t, c, rehashed=r, made=made, states=states, work=args.workdir, memory=memory,
                               timeout=args.timeout, seq=k): (t, c, r) for k, (t, c, r) in enumerate(jobs)}
        for future in concurrent.futures.as_completed(futures):
            t, c, r = futures[future]
            for reader, outcome in future.result():
                table[t.name][outcome.kind] += 1
                if outcome.kind not in ("ok", "one line"):
                    key = f"{t.name} / {c.name}{' (rehashed)' if r else ''} / {reader}: {outcome.kind}"
                    examples.setdefault(key, outcome.detail)
    total: collections.Counter[str] = collections.Counter()
    for name in (t.name for t in chosen):
        total.update(table[name])
        print(f"{name:24s} {dict(sorted(table[name].items()))}")
    print(f"{'all':24s} {dict(sorted(total.items()))}  ({sum(total.values())} runs, "
          f"{time.perf_counter() - t0:.0f} s)")
    for key, detail in sorted(examples.items()):
        print(f"\n== {key}\n{detail.strip()[-1200:]}")


if __name__ == "__main__":
    main()
