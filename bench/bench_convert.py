"""Side-by-side benchmark of `shardsmith convert --to webdataset` and its loader (issue 3), in one run.

    python bench/bench_convert.py [--n 20000] [--workdir /tmp/shardsmith-bench] [--repeat 3] [--skip-anchors]

On one synthetic ImageFolder (bench/images.py: N JPEGs, 100 classes, ~27 KB each), page cache warm:
  (a) writing: GNU `tar cf` of the folder (the physical limit: it neither fsyncs nor hashes), beside
      it `tar cf` + fsync + sha256 of the archive (the like-for-like row: shardsmith's shards are on
      disk and hashed when it ends, tar's archive is only in the page cache; issue 18, point 7),
      `tar cf` + fsync alone, reading (and reading + sha256) every file from Python,
      `shardsmith convert --to webdataset` (exact shuffle, 2 workers), webdataset's ShardWriter,
      MosaicML MDSWriter, LitData optimize (2 workers) -- the anchors are bench/anchors/convert_*.py;
  (b) iterating without decoding, shuffled against shuffled and in order against in order (issue 18,
      point 5: comparing our exact shuffle with another tool's in-order pass was not like for like):
      shardsmith's `ds.iter(shuffle=True)` (an exact permutation of the whole dataset) against LitData's
      `StreamingDataset(shuffle=True)` (chunk-local: chunks in a random order, samples shuffled within
      the chunk); `ds.iter(shuffle=False)` against webdataset's `WebDataset` in order (over
      shardsmith's tars), MosaicML `StreamingDataset` (batch_size=256, see convert_mds.py) and LitData
      `StreamingDataset` in order (over their own output);
  (c) random access `ds[i]` of shardsmith (wids' `ShardListDataset[i]` on the same tars beside it);
  (d) augmentation, images/s per core: `convert --augment random-resized-crop=224,hflip --workers 1`
      vs a bare simplejpeg + Pillow loop doing the same operations in one process, encoding with the
      same 4:2:0 chroma subsampling as shardsmith (simplejpeg's default is 4:4:4, which wrote 18 %
      more bytes, 56.0 MB against 47.4 MB: issue 18, point 2; bench_augment.py does the same). There is no
      reduced-scale decoding row: shardsmith decodes at 1/2..1/8 scale only for crops of at least
      twice 224 px (448 px) on both sides, and the bench images (at most 500x375) never give one, so
      that row only repeated the plain loop.
Every tool runs as a child process. Rows of (a) and (d) are wall times that include start-up; rows of
(b) are the seconds a child reports from opening the dataset to the end of the loop (start-up and
imports excluded: torch alone takes seconds to import; for shardsmith that is importing the tar
loader, numpy with it, and the registry's one-time scan of installed formats, which were inside the
clock until issue 18). Every loop reads one byte of each 4 KB page of every bytes-like field
(convert_common.touch): LitData hands out memoryviews into its map, and a loop that only took their
len() never read the images at all, while shardsmith's and webdataset's copies had. Before each timed run the files it reads are
read once (the page cache on these shared VMs loses pages within seconds when other work runs).
MosaicML and LitData run from bench/.venv-anchors (bash bench/anchors/setup.sh); a tool that is not
installed there gets "not installed" in its rows; webdataset and wids come with the project venv. MB are 10**6 bytes of JPEG.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from harness import NOT_INSTALLED, anchor_python, clear, code_version, last_json, run_children, verdict, warm  # noqa: E402,E501

ANCHORS = HERE / "anchors"
sys.path.insert(0, str(ANCHORS))
from convert_common import list_images, touch  # noqa: E402  (what every iteration loop reads of a sample)

SKIPPED = "skipped (--skip-anchors)"
WORKERS = 2
MDS_BATCH = 256  # bench/anchors/convert_mds.py's StreamingDataset batch_size: a training loop's
AUGMENT = "random-resized-crop=224,hflip"
AUG_SIZE = 224
AUG_QUALITY = 90  # shardsmith's default --quality
AUG_CHROMA = "420"  # the chroma subsampling shardsmith's augmenter encodes with


# ---------------------------------------------------------------- child baselines (run in a fresh process)

def _images(folder: str, limit: int | None = None) -> list[tuple[str, str, int]]:
    images = list_images(folder)
    return images[:limit] if limit else images


def _read(folder: str) -> dict:
    """The physical limit of reading: list the folder and read every file into a bytes object."""
    t0 = time.perf_counter()
    n = size = 0
    for path, _key, _label in _images(folder):
        with open(path, "rb") as f:
            size += len(f.read())
        n += 1
    return {"seconds": time.perf_counter() - t0, "samples": n, "bytes": size}


def _sha_files(folder: str) -> dict:
    """The hashing floor: list the folder and read every file into one sha256 (hashlib, as shardsmith)."""
    import hashlib

    t0 = time.perf_counter()
    n = size = 0
    digest = hashlib.sha256()
    for path, _key, _label in _images(folder):
        with open(path, "rb") as f:
            data = f.read()
        digest.update(data)
        size += len(data)
        n += 1
    return {"seconds": time.perf_counter() - t0, "samples": n, "bytes": size}


def _tar_durable_sha(tar: str, parent: str, name: str) -> dict:
    """What shardsmith guarantees, with standard tools: GNU tar, then fsync of the archive, then its
    sha256 (hashlib over the page cache; one after the other, one core)."""
    import hashlib

    t0 = time.perf_counter()
    subprocess.run(["tar", "cf", tar, "-C", parent, name], check=True)
    digest = hashlib.sha256()
    with open(tar, "rb") as f:
        os.fsync(f.fileno())
        while block := f.read(1 << 22):
            digest.update(block)
    return {"seconds": time.perf_counter() - t0}


def _open_shardsmith(out: str):
    import shardsmith

    try:
        return shardsmith.open(out), None
    except Exception as e:  # the webdataset loader is being written: report, do not crash the run
        return None, f"shardsmith.open raised {type(e).__name__}: {str(e).splitlines()[0][:90]}"


def _ss_iter(out: str, order: str) -> dict:
    # start-up before the clock starts, as the anchors import theirs before theirs: ``import
    # shardsmith.loader`` alone imports neither the loaders nor numpy (the CLI needs neither), so the
    # tar loader's module is imported here and the registry reads the installed formats once (a
    # one-time cost of the process: 0.1-0.2 s that were counted as iteration before)
    from shardsmith import registry
    from shardsmith.loader import TarDataset  # noqa: F401

    registry.formats()
    t0 = time.perf_counter()
    ds, skip = _open_shardsmith(out)
    if skip:
        return {"skip": skip}
    n = size = 0
    for sample in ds.iter(shuffle=order == "shuffled", seed=0):
        n += 1
        size += touch(sample)
    return {"seconds": time.perf_counter() - t0, "samples": n, "bytes": size, "len": len(ds)}


def _rates(get, n: int, seconds: float = 1.0) -> list[float]:
    """Samples/s of get(i) at uniformly random i: 3 runs of `seconds` each."""
    import numpy as np

    idx = np.random.default_rng(0).integers(0, n, 1 << 20).tolist()
    get(idx[0])
    rates = []
    for r in range(3):
        k, t0 = r << 18, time.perf_counter()
        while (dt := time.perf_counter() - t0) < seconds:
            for i in idx[k:k + 256]:
                get(i)
            k += 256
        rates.append((k - (r << 18)) / dt)
    return rates


def _ss_getitem(out: str) -> dict:
    ds, skip = _open_shardsmith(out)
    if skip:
        return {"skip": skip}
    sample = ds[0]
    if not isinstance(sample, dict) or not touch(sample):
        return {"skip": f"ds[0] returned {type(sample).__name__} without bytes fields"}
    return {"rates": _rates(lambda i: touch(ds[i]), len(ds)), "len": len(ds)}


def _wids_getitem(out: str) -> dict:
    try:
        import wids

        ds = wids.ShardListDataset(os.path.join(out, "__index__", "train.wids.json"), transformations=[])
        touch(ds[0])
    except Exception as e:
        return {"skip": f"wids: {type(e).__name__}: {str(e).splitlines()[0][:90]}"}
    return {"rates": _rates(lambda i: touch(ds[i]), len(ds)), "len": len(ds)}


def _rrc_params(rng, width: int, height: int) -> tuple[int, int, int, int]:
    """torchvision RandomResizedCrop.get_params (scale 0.08..1, ratio 3/4..4/3): left, top, w, h."""
    area = width * height
    log_ratio = (math.log(3 / 4), math.log(4 / 3))
    for _ in range(10):
        target = area * rng.uniform(0.08, 1.0)
        aspect = math.exp(rng.uniform(*log_ratio))
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return rng.randint(0, width - w), rng.randint(0, height - h), w, h
    w, h = width, height  # the central crop within the ratio range
    if w / h < 3 / 4:
        h = int(round(w / (3 / 4)))
    elif w / h > 4 / 3:
        w = int(round(h * (4 / 3)))
    return (width - w) // 2, (height - h) // 2, w, h


def _bare_augment(folder: str, limit: int) -> dict:
    """A user's loop: read, simplejpeg decode, random-resized-crop 224 (one Pillow resize with a box),
    hflip with p=0.5, simplejpeg encode at quality 90 with 4:2:0 chroma, as shardsmith encodes."""
    import random

    import numpy as np
    import simplejpeg
    from PIL import Image

    t0 = time.perf_counter()
    rng = random.Random(0)
    n = size = 0
    for path, _key, _label in _images(folder, limit):
        with open(path, "rb") as f:
            data = f.read()
        height, width = simplejpeg.decode_jpeg_header(data)[:2]
        left, top, w, h = _rrc_params(rng, width, height)
        arr = simplejpeg.decode_jpeg(data, colorspace="RGB")
        im = Image.fromarray(arr).resize((AUG_SIZE, AUG_SIZE), Image.Resampling.BILINEAR,
                                         box=(left, top, left + w, top + h))
        if rng.random() < 0.5:
            im = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        size += len(simplejpeg.encode_jpeg(np.asarray(im), quality=AUG_QUALITY, colorspace="RGB",
                                           colorsubsampling=AUG_CHROMA))
        n += 1
    return {"seconds": time.perf_counter() - t0, "samples": n, "bytes": size}


def child(name: str, args: list[str]) -> dict:
    if name == "warm":
        return warm(args)
    if name == "read":
        return _read(args[0])
    if name == "sha-files":
        return _sha_files(args[0])
    if name == "tar-durable-sha":
        return _tar_durable_sha(*args)
    if name == "ss-iter":
        return _ss_iter(args[0], args[1])
    if name == "ss-getitem":
        return _ss_getitem(args[0])
    if name == "wids-getitem":
        return _wids_getitem(args[0])
    if name == "bare-aug":
        return _bare_augment(args[0], int(args[1]))
    raise SystemExit(f"unknown child {name}")


# ---------------------------------------------------------------- running and measuring children

@dataclass
class Result:
    wall: float
    cpu: float  # user + system seconds of the child and its reaped descendants
    out: dict


def run(cmd: list[str], log: Path) -> Result:
    """Run `cmd`; stdout's last JSON line (if any) is parsed, stderr goes to `log`; raise on failure."""
    wall, cpu, (out,) = run_children([cmd], log)
    return Result(wall, cpu, last_json(out))


@dataclass
class Row:
    name: str
    times: list[float] = field(default_factory=list)  # wall, or the child's own seconds
    cpus: list[float] = field(default_factory=list)
    loops: list[float] = field(default_factory=list)  # a wall row's own seconds after its imports, if it says
    samples: int | None = None
    note: str = ""
    inner: bool = False  # times are the child's own seconds (its CPU time would include start-up)

    @property
    def t(self) -> float:
        return statistics.median(self.times)

    @property
    def ok(self) -> bool:
        return bool(self.times)


class Bench:
    def __init__(self, args: argparse.Namespace, folder: Path, info: dict):
        self.work: Path = args.workdir
        self.repeat: int = args.repeat
        self.folder = folder
        self.size: int = info["bytes"]
        self.n: int = info["n"]
        self.logs = self.work / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.out = self.work / "out"

    def me(self, name: str, *args: str | Path) -> list[str]:
        return [sys.executable, str(HERE / "bench_convert.py"), "--child", name, *map(str, args)]

    def warm(self, *paths: Path) -> None:
        run(self.me("warm", *paths), self.logs / "warm.log")

    def measure(self, row: Row, cmd: list[str], *, warm: list[Path], log: str, inner: bool = False,
                before: list[Path] = ()) -> Result | None:
        """One timed run of `cmd` into `row`; a failure becomes the row's note instead of stopping the run."""
        clear(before)
        self.warm(*warm)
        try:
            res = run(cmd, self.logs / f"{log}.log")
        except (RuntimeError, FileNotFoundError) as e:
            row.note = f"failed: {str(e).splitlines()[-1][:100]} (see {self.logs / log}.log)"
            return None
        if "skip" in res.out:
            row.note = f"skipped: {res.out['skip']}"
            return None
        row.inner = inner
        row.times.append(res.out["seconds"] if inner else res.wall)
        if not inner and "seconds" in res.out:
            row.loops.append(res.out["seconds"])
        row.cpus.append(res.cpu)
        row.samples = res.out.get("samples", row.samples)
        return res

    def shardsmith_convert(self, out: Path, *extra: str, workers: int = WORKERS) -> list[str]:
        return [sys.executable, "-m", "shardsmith", "convert", str(self.folder), "-o", str(out), "--to", "webdataset",
                "--workers", str(workers), "--quiet", *extra]


def samples_of(out: Path) -> int | None:
    try:
        return json.loads((out / "manifest.json").read_text())["splits"]["train"]["samples"]
    except (OSError, KeyError, ValueError):
        return None


# ---------------------------------------------------------------- the sections

def table(title: str, rows: list[Row], ref: Row, size: int, unit: str = "s") -> None:
    print(f"\n{title}")
    print(f"  {'':50s} {unit:>8s} {'cpu s':>7s} {'MB/s':>7s} {'samples/s':>10s} {'x shardsmith':>12s}  runs")
    loops = any(r.loops for r in rows)
    for r in rows:
        if not r.ok:
            print(f"  {r.name:50s} {'-':>8s} {'-':>7s} {'-':>7s} {'-':>10s} {'-':>12s}  {r.note}")
            continue
        ratio = f"{r.t / ref.t:.2f}x" if ref.ok else "-"
        rate = f"{r.samples / r.t:10,.0f}" if r.samples else f"{'':10s}"
        cpu = "-" if r.inner else f"{statistics.median(r.cpus):.2f}"
        loop = f"  (after imports: {statistics.median(r.loops):.2f} s)" if r.loops and loops else ""
        print(f"  {r.name:50s} {r.t:8.2f} {cpu:>7s} {size / 1e6 / r.t:7.0f} {rate} "
              f"{ratio:>12s}  {len(r.times)}{loop}  {r.note}")


def peer_note(peers: dict[str, str | None] | None) -> str:
    return SKIPPED if peers is None else NOT_INSTALLED


def write_section(b: Bench, peers: dict[str, str | None] | None) -> dict[str, Row]:
    w = b.work
    tar, read = Row("GNU tar cf of the folder (limit: no fsync, no hash)"), Row("read every file from Python")
    # shardsmith's shards are fsynced and hashed when it ends; tar's archive is neither: the like-for-like row
    tar_sync_sha = Row("tar cf + fsync + sha256 (like for like)")
    tar_sync = Row("  tar cf + fsync of the archive")
    sha = Row("  read + sha256 of every file from Python")
    ss = Row(f"shardsmith convert --to webdataset --workers {WORKERS}")
    wds, mds = Row("webdataset ShardWriter (1 process)"), Row("MosaicML MDSWriter (1 process)")
    lit = Row(f"LitData optimize ({WORKERS} workers)")
    for _ in range(b.repeat):  # interleaved, so that drift on a shared machine hits every row alike
        b.measure(tar, ["tar", "cf", str(w / "folder.tar"), "-C", str(b.folder.parent), b.folder.name],
                  warm=[b.folder], log="tar", before=[w / "folder.tar"])
        b.measure(tar_sync, ["sh", "-c", 'tar cf "$1" -C "$2" "$3" && sync "$1"', "sh", str(w / "folder.tar"),
                             str(b.folder.parent), b.folder.name], warm=[b.folder], log="tar-sync",
                  before=[w / "folder.tar"])
        b.measure(tar_sync_sha, b.me("tar-durable-sha", w / "folder.tar", b.folder.parent, b.folder.name),
                  warm=[b.folder], log="tar-sync-sha", before=[w / "folder.tar"])
        b.measure(read, b.me("read", b.folder), warm=[b.folder], log="read")
        b.measure(sha, b.me("sha-files", b.folder), warm=[b.folder], log="sha-files")
        if b.measure(ss, b.shardsmith_convert(b.out), warm=[b.folder], log="shardsmith-convert", before=[b.out]):
            ss.samples = samples_of(b.out)
        b.measure(wds, [sys.executable, str(ANCHORS / "convert_webdataset.py"), "write", str(b.folder), "-o",
                        str(w / "wds")], warm=[b.folder], log="wds-write", before=[w / "wds"])
        if peers and peers["mds"]:
            b.measure(mds, [peers["mds"], str(ANCHORS / "convert_mds.py"), "write", str(b.folder), "-o",
                            str(w / "mds")], warm=[b.folder], log="mds-write", before=[w / "mds"])
        if peers and peers["litdata"]:
            b.measure(lit, [peers["litdata"], str(ANCHORS / "convert_litdata.py"), "write", str(b.folder), "-o",
                            str(w / "litdata"), "--workers", str(WORKERS)], warm=[b.folder], log="litdata-write",
                      before=[w / "litdata"])
    for r in (tar, tar_sync, tar_sync_sha, read, sha):
        r.samples = r.samples or samples_of(b.out)
    for r, tool in ((mds, "mds"), (lit, "litdata")):
        if not (peers and peers[tool]):
            r.note = peer_note(peers)
    table(f"(a) writing {b.size / 1e6:.0f} MB of JPEGs ({samples_of(b.out) or '?'} files), wall s incl. start-up, "
          f"median of {b.repeat}", [tar, tar_sync_sha, tar_sync, read, sha, ss, wds, mds, lit], ss, b.size)
    print("  shardsmith: exact global shuffle, header check of every image, sha256, offsets and wids index, fsync;"
          " the others write in folder order, and neither fsync nor hash")
    if ss.ok and tar.ok:
        verdict("issue 3: convert within 1.5x of tar cf (the limit)", ss.t <= 1.5 * tar.t,
                f"{ss.t / tar.t:.2f}x ({ss.t:.2f} s vs {tar.t:.2f} s)")
    if ss.ok and tar_sync_sha.ok:
        print(f"  like for like (on disk and hashed, as shardsmith's shards): convert takes {ss.t / tar_sync_sha.t:.2f}x "
              f"the time of tar cf + fsync + sha256 ({ss.t:.2f} s vs {tar_sync_sha.t:.2f} s)")
    for r in (mds, lit):
        if ss.ok and r.ok:
            verdict(f"issue 3: convert faster than {r.name.split(' (')[0]}", ss.t < r.t, f"{r.t / ss.t:.2f}x")
    return {"ss": ss}


def iterate_section(b: Bench, peers: dict[str, str | None] | None) -> None:
    w = b.work
    ss = Row("shardsmith ds.iter(shuffle=True, seed=0), exact")
    lit_shuf = Row("LitData StreamingDataset(shuffle=True), chunk-local")
    ss_order = Row("shardsmith ds.iter(shuffle=False)")
    wds = Row("webdataset WebDataset (shardsmith's tars)")
    mds = Row(f"MosaicML StreamingDataset (local, batch_size={MDS_BATCH})")
    lit = Row("LitData StreamingDataset")
    for _ in range(b.repeat):  # interleaved, so that drift on a shared machine hits every row alike
        b.measure(ss, b.me("ss-iter", b.out, "shuffled"), warm=[b.out], log="shardsmith-iter", inner=True)
        b.measure(ss_order, b.me("ss-iter", b.out, "in-order"), warm=[b.out], log="shardsmith-iter-order",
                  inner=True)
        b.measure(wds, [sys.executable, str(ANCHORS / "convert_webdataset.py"), "iterate", str(b.out)],
                  warm=[b.out], log="wds-iter", inner=True)
        if peers and peers["mds"] and (w / "mds").exists():
            b.measure(mds, [peers["mds"], str(ANCHORS / "convert_mds.py"), "iterate", str(w / "mds")],
                      warm=[w / "mds"], log="mds-iter", inner=True)
        if peers and peers["litdata"] and (w / "litdata").exists():
            lit_cmd = [peers["litdata"], str(ANCHORS / "convert_litdata.py"), "iterate", str(w / "litdata")]
            b.measure(lit_shuf, [*lit_cmd, "--shuffle"], warm=[w / "litdata"], log="litdata-iter-shuffle", inner=True)
            b.measure(lit, lit_cmd, warm=[w / "litdata"], log="litdata-iter", inner=True)
    for r, tool in ((mds, "mds"), (lit, "litdata"), (lit_shuf, "litdata")):
        if not (peers and peers[tool]):
            r.note = peer_note(peers)
        elif not r.ok and not r.note:
            r.note = "no output of (a) to read"
    title = f"(b) iterating without decoding, seconds from opening to the end of the loop, median of {b.repeat}"
    table(title + "\n  shuffled:", [ss, lit_shuf], ss, b.size)
    table("  in order:", [ss_order, wds, mds, lit], ss_order, b.size)
    print("  what each shuffle guarantees: shardsmith's is an exact permutation of the whole dataset (any two samples"
          " may be neighbours);\n  LitData's is chunk-local (its chunks in a random order, samples shuffled within"
          " a chunk: neighbours come from one chunk)")
    if ss.ok and wds.ok:
        verdict("issue 3: shuffled iteration >= 2x webdataset's in-order", wds.t / ss.t >= 2, f"{wds.t / ss.t:.2f}x")
    pairs = ((ss, lit_shuf, "issue 3/18: exact-shuffled iteration as fast as LitData's chunk-local shuffle"),
             (ss_order, lit, "in-order iteration as fast as LitData's in order"))
    for ours, theirs, label in pairs:
        if ours.ok and theirs.ok:
            verdict(label, ours.t <= theirs.t, f"{theirs.t / ours.t:.2f}x ({ours.t:.2f} s vs {theirs.t:.2f} s)")
    if not ss.ok:
        print(f"  (no verdict on iteration: {ss.note})")


def getitem_section(b: Bench) -> None:
    print("\n(c) random access, samples/s at uniformly random i (median of 3 x 1 s, in one child process)")
    best = None
    for name, label in (("ss-getitem", "shardsmith ds[i]"), ("wids-getitem", "wids ShardListDataset[i] (same tars)")):
        b.warm(b.out)
        try:
            res = run(b.me(name, b.out), b.logs / f"{name}.log").out
        except RuntimeError as e:
            res = {"skip": f"failed: {str(e).splitlines()[-1][:100]}"}
        if "skip" in res:
            print(f"  {label:50s} {'-':>10s}  {res['skip']}")
            continue
        rate = statistics.median(res["rates"])
        print(f"  {label:50s} {rate:10,.0f}  (runs: {', '.join(f'{x:,.0f}' for x in res['rates'])})")
        if name == "ss-getitem":
            best = rate
    if best is not None:
        verdict("issue 3: ds[i] >= 100k samples/s", best >= 100_000, f"{best:,.0f}/s")
    else:
        print("  (no verdict on ds[i]: the loader is not there yet)")


def augment_section(b: Bench, n: int) -> None:
    ss = Row("shardsmith convert --augment ... --workers 1")
    bare = Row("bare loop: simplejpeg, Pillow resize(box), flip, 4:2:0 encode")
    out = b.work / "out-augment"
    limit = ["--limit", str(n)] if n < b.n else []
    for _ in range(b.repeat):
        b.measure(ss, b.shardsmith_convert(out, "--augment", AUGMENT, "--copies", "1", *limit, workers=1),
                  warm=[b.folder], log="shardsmith-augment", before=[out])
        b.measure(bare, b.me("bare-aug", b.folder, n), warm=[b.folder], log="bare-aug")
    ss.samples = samples_of(out)
    title = (f"(d) augmentation {AUGMENT} -> JPEG q{AUG_QUALITY}, first {n:,} images, one core each, "
             f"wall s incl. start-up, median of {b.repeat}")
    print(f"\n{title}")
    print(f"  {'':60s} {'s':>7s} {'cpu s':>7s} {'images/s/core':>14s} {'x shardsmith':>12s}  runs")
    for r in (ss, bare):
        if not r.ok:
            print(f"  {r.name:60s} {'-':>7s}  {r.note}")
            continue
        ratio = f"{r.t / ss.t:.2f}x" if ss.ok else "-"
        print(f"  {r.name:60s} {r.t:7.2f} {statistics.median(r.cpus):7.2f} {(r.samples or n) / r.t:14,.0f} "
              f"{ratio:>12s}  {len(r.times)}  {r.note}")
    if ss.ok and bare.ok:
        verdict("issue 3: augmentation within 1.2x of the bare loop", ss.t <= 1.2 * bare.t, f"{ss.t / bare.t:.2f}x")


def precompile() -> None:
    """Byte-compile shardsmith, as pip does when it installs a package. This checkout is an editable
    install, often run with PYTHONDONTWRITEBYTECODE set: each shardsmith child would compile its
    modules from source first (about 0.1 s), which no installed copy does, while the anchors'
    libraries come byte-compiled in their venvs."""
    import compileall

    ok = compileall.compile_dir(str(HERE.parent / "shardsmith"), quiet=1)
    print(f"shardsmith byte-compiled{'' if ok else ' (with errors)'} before timing, as an installed copy is")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20_000, help="images in the folder (default 20,000)")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/shardsmith-bench"))
    ap.add_argument("--repeat", type=int, default=3, help="runs of every row (medians); default 3")
    ap.add_argument("--aug-n", type=int, default=5000, help="images augmented per run (default 5,000; 0 = all)")
    ap.add_argument("--skip-anchors", action="store_true", help="skip MosaicML Streaming and LitData")
    ap.add_argument("--only", default="abcd", help="sections to run, e.g. 'ab' (default abcd)")
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1:])))
        return

    sys.path.insert(0, str(HERE))
    from images import ensure_imagefolder

    args.workdir = args.workdir.resolve()
    args.workdir.mkdir(parents=True, exist_ok=True)
    folder = args.workdir / (f"imagefolder-{args.n}" if args.n != 20_000 else "imagefolder")
    info = ensure_imagefolder(folder, args.n)
    peers = None if args.skip_anchors else {"mds": anchor_python("streaming"), "litdata": anchor_python("litdata")}
    if peers and not all(peers.values()):
        print(f"note: {', '.join(k for k, v in peers.items() if not v)} not installed; bash bench/anchors/setup.sh "
              "installs them",
              file=sys.stderr)
    print(f"shardsmith convert benchmark: {folder} ({info['n']:,} JPEGs, {info['bytes'] / 1e6:.0f} MB, "
          f"{info['bytes'] / info['n'] / 1e3:.1f} KB each), {os.cpu_count()} cores, workdir {args.workdir}, "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    version = code_version()
    print(f"shardsmith under test: {version}")
    precompile()
    b = Bench(args, folder, info)
    if "a" in args.only or not (b.out / "manifest.json").exists():
        write_section(b, peers)
    if "b" in args.only:
        iterate_section(b, peers)
    if "c" in args.only:
        getitem_section(b)
    if "d" in args.only:
        augment_section(b, min(args.aug_n or info["n"], info["n"]))
    if code_version() != version:
        print(f"\nWARNING: the code changed during the run ({version} -> {code_version()}): rows mix versions")
    print(f"\nload average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())} (1, 5, 15 min; "
          f"anything else running on this machine skews the figures)")


if __name__ == "__main__":
    main()
