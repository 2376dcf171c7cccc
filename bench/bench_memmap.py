"""Fixed-shape export (issue 17, point 5): ``convert --to memmap`` against the script a user writes instead.

    python bench/bench_memmap.py [--events 200000] [--mean-pulses 40] [--max-len 64] [--workers 2] [--repeat 3]
                                 [--workdir /tmp/shardsmith-bench/memmap]

On one synthetic IceCube-like ROOT file (``make_icecube_like``, cached in the workdir), the 5 float pulse
fields and 3 event scalars, every event padded or cut to --max-len:
  - ``shardsmith``: ``convert --to memmap`` (exact global shuffle, sha256 of every file, fsync), wall s;
  - ``bare``: uproot + awkward + numpy in one process, the few lines a user writes (read the branches whole,
    ``ak.pad_none(clip=True)``, ``fill_none(0)``, stack, ``tofile``, fsync): no shuffle, no hash, no resume;
  - ``hdf5``: the same conversion into ``--to hdf5`` (context: what the engine's read, shuffle and decode cost
    whatever the writer);
  - ``disk``: writing the same number of bytes from memory with fsync: what no converter beats.
Each runs as a child process (start-up included); the median of --repeat runs. The input is read once first.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import key_figure, median_time  # noqa: E402

PULSES = ("pulses_time", "pulses_charge", "pulses_dom_x", "pulses_dom_y", "pulses_dom_z")
SCALARS = ("event_id", "azimuth", "zenith")

BARE = """
import os, sys, numpy as np, uproot, awkward as ak
src, out, L = sys.argv[1], sys.argv[2], int(sys.argv[3])
fields, scalars = {pulses!r}, {scalars!r}
with uproot.open(src) as f:
    a = f["events"].arrays([*fields, *scalars], library="ak")
values = np.stack([ak.to_numpy(ak.fill_none(ak.pad_none(a[k], L, clip=True), 0.0)) for k in fields], -1)
files = {{"values": values.astype(np.float32), "lengths": np.minimum(ak.to_numpy(ak.num(a[fields[0]])), L)}}
files.update({{k: ak.to_numpy(a[k]) for k in scalars}})
for name, arr in files.items():
    with open(os.path.join(out, name + ".bin"), "wb") as fh:
        arr.tofile(fh); fh.flush(); os.fsync(fh.fileno())
"""

DISK = """
import os, sys
path, total = sys.argv[1], int(sys.argv[2])
block = os.urandom(1 << 20) * 16
with open(path, "wb") as fh:
    while total > 0:
        total -= fh.write(block[:min(total, len(block))])
    fh.flush(); os.fsync(fh.fileno())
"""


def timed(cmd: list[str], repeat: int) -> float:
    """The median wall time of a child command (its output captured)."""
    return median_time(lambda: subprocess.run(cmd, check=True, capture_output=True), repeat)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=200_000)
    p.add_argument("--mean-pulses", type=float, default=40)
    p.add_argument("--max-len", type=int, default=64)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--workdir", type=Path, default=Path("/tmp/shardsmith-bench/memmap"))
    a = p.parse_args()
    a.workdir.mkdir(parents=True, exist_ok=True)
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    src = a.workdir / f"icecube-{a.events}-{a.mean_pulses:g}.root"
    if not src.is_file():
        from shardsmith.demo.root_files import make_icecube_like

        make_icecube_like(src, events=a.events, mean_pulses=a.mean_pulses, seed=0)
    src.read_bytes()  # in the page cache, for every tool alike
    py = sys.executable
    out = a.workdir / "out"
    ours = timed([py, "-m", "shardsmith", "convert", str(src), "-o", str(out), "--to", "memmap", "--overwrite", "-q",
                  "--max-len", str(a.max_len), "--branches", ",".join((*PULSES, *SCALARS)),
                  "--workers", str(a.workers)], a.repeat)
    hdf5 = timed([py, "-m", "shardsmith", "convert", str(src), "-o", str(a.workdir / "h5"), "--to", "hdf5", "-q",
                  "--overwrite", "--branches", ",".join((*PULSES, *SCALARS)), "--workers", str(a.workers)], a.repeat)
    written = sum(f.stat().st_size for f in out.iterdir() if f.name != "manifest.json")
    bare_out = a.workdir / "bare"
    bare_out.mkdir(exist_ok=True)
    bare = timed([py, "-c", BARE.format(pulses=PULSES, scalars=SCALARS), str(src), str(bare_out), str(a.max_len)],
                 a.repeat)
    disk = timed([py, "-c", DISK, str(a.workdir / "disk.bin"), str(written)], a.repeat)
    (a.workdir / "disk.bin").unlink()
    mb = written / 1e6
    print(f"{a.events:,} events, ~{a.mean_pulses:g} pulses, L={a.max_len}, F={len(PULSES)}: input "
          f"{src.stat().st_size / 1e6:,.0f} MB, output {mb:,.0f} MB; median of {a.repeat}, {os.cpu_count()} cores")
    for name, t in ((f"shardsmith (--workers {a.workers})", ours), ("bare uproot+numpy", bare),
                    ("shardsmith --to hdf5", hdf5), ("disk write", disk)):
        print(f"  {name:26s} {t:6.2f} s  {mb / t:7,.0f} MB/s written")
    print(f"  shardsmith / bare = {ours / bare:.2f}x, shardsmith / disk = {ours / disk:.2f}x; "
          f"load average at end: {os.getloadavg()[0]:.2f}")
    key_figure("convert --to memmap", f"{mb / ours:,.0f} MB/s written, {ours / bare:.2f}x the bare uproot+numpy "
               f"script's time, {ours / disk:.2f}x a bare disk write's")


if __name__ == "__main__":
    main()
