"""The copy mode without the whole listing in memory: a folder listed to disk (``engine/inputs/folder_listing.py``)
is ``discover``'s listing, a listing on disk gives back what was written (``core/file_listing.py``), the
plan made in small buckets is the plan made in one (``engine/copying/copy_plan.py``), and the memory of a
copy-mode conversion does not grow with its file count."""

from __future__ import annotations

import os
import pickle
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardsmith.core import file_listing
from shardsmith.core.file_listing import FileListing, paths_of
from shardsmith.core.input_file import InputFile
from shardsmith.engine import choose
from shardsmith.engine.copying import copy_plan
from shardsmith.engine.copying.image_copy import plan_shards
from shardsmith.engine.inputs import folder_listing
from shardsmith.engine.inputs.files import discover
from shardsmith.engine.output import resume
from shardsmith.formats.webdataset.image_tar import TarCopier
from shardsmith.kit import keys as keymod
from shardsmith.kit.rollover import shard_bounds

_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12) | st.just("caf\udce9")  # undecodable byte
_files = st.lists(st.builds(InputFile, path=_text, rel=_text, index=st.integers(0, 2**40), size=st.integers(0, 2**50),
                            group=_text, mtime_ns=st.integers(0, 2**62), ctime_ns=st.integers(0, 2**62),
                            ino=st.integers(0, 2**62), origin=st.just("")), max_size=20)  # (local files)


@settings(max_examples=25, deadline=None)
@given(files=_files, data=st.data())
def test_any_range_comes_back_as_it_was_written(tmp_path_factory, files, data):
    listing = FileListing.of(files, folder=tmp_path_factory.mktemp("l") / "listing")
    assert len(listing) == len(files) and listing.nbytes == sum(f.size for f in files)
    start = data.draw(st.integers(0, len(files)))
    stop = data.draw(st.integers(start, len(files)))
    assert listing.rows(start, stop) == tuple(files[start:stop]) and listing[start:stop] == files[start:stop]
    assert list(pickle.loads(pickle.dumps(listing))) == files
    paths = pickle.loads(pickle.dumps(paths_of(listing)))  # (a worker's copy of the writer's sources)
    assert [paths[i] for i in range(len(files))] == [f.path for f in files]


def _tree(root: Path) -> Path:
    """Names whose order as strings is not the order of their folders ("a.b/" before "a/")."""
    for rel in ("a/x.jpg", "a.b/y.jpg", "a/b/z.JPG", "b/\u00e9t\u00e9.png", "b/n.txt", "b/.hidden.jpg", "c/d/e/f.jpg",
                "a/0.jpg", "a-/1.jpg", "loose.jpg", *(f"m/{i}.jpg" for i in range(23))):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(rel.encode() * 3)
    return root


@pytest.mark.parametrize(("run_files", "fan_in"), [(None, None), (3, 2), (1, 64)])
def test_a_folder_listed_on_disk_is_the_listing_discover_holds(tmp_path, run_files, fan_in):
    root = _tree(tmp_path / "in")
    held = discover([str(root)], suffixes=(".jpg", ".png"))
    listing = folder_listing.list_folder(str(root), suffixes=(".jpg", ".png"), dest=tmp_path / "listing",
                                         run_files=run_files, fan_in=fan_in)
    assert isinstance(held, list) and list(listing) == held
    assert listing[5] == held[5] and listing[-1] == held[-1] and listing.nbytes == sum(f.size for f in held)
    on_disk = discover([str(root)], suffixes=(".jpg", ".png"), listing=tmp_path / "again")
    assert isinstance(on_disk, FileListing) and list(on_disk) == held
    # what is taken from the listing in passes equals what the list gives
    assert resume.run_identity("convert", _Opts(), on_disk) == resume.run_identity("convert", _Opts(), held)
    assert choose.infer_source(on_disk, {"x": _Images}) == "x"


class _Opts:
    """(``run_identity`` reads a dataclass's fields.)"""

    __dataclass_fields__: dict = {}  # noqa: RUF012


class _Images:
    suffixes = (".jpg",)
    events_variant = None


def _reference(files: list[InputFile], *, copier: TarCopier, seed: int, shuffle: bool,
               splits: tuple[tuple[str, float], ...]) -> dict[str, list[list[str]]]:
    """Each split's shards as lists of files, by the whole-array definition of the output order."""
    split, keys, order = keymod.place(seed=seed, shuffle=shuffle, splits=splits, paths=[f.rel for f in files],
                                      records=np.zeros(len(files), dtype=np.int64),
                                      file_index=np.asarray([f.index for f in files]))
    perm = keymod.output_order(keys, order)
    weights = copier.weights(np.asarray([f.size for f in files], dtype=np.int64))
    out = {}
    for s, (name, _) in enumerate(splits):
        members = perm[split[perm] == s]
        bounds = shard_bounds(weights[members], max_weight=copier.max_weight, max_samples=copier.max_samples).tolist()
        out[name] = [[files[j].rel for j in members[a:b]] for a, b in zip(bounds[:-1], bounds[1:])]
    return out


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("bucket_files", [None, 50, 7])
def test_the_plan_made_in_buckets_is_the_output_order(tmp_path, shuffle, bucket_files):
    files = [InputFile(path=f"/x/c{i % 3}/{i}.jpg", rel=f"c{i % 3}/{i}.jpg", index=i, size=(i * 7919) % 3000,
                       group=f"c{i % 3}") for i in range(200)]
    files[10:14] = [f._replace(size=0) for f in files[10:14]]
    copier = TarCopier(shard_samples=9, shard_bytes=40_000, wids_md5=False)
    splits = (("train", 0.7), ("val", 0.2), ("test", 0.1))
    plan = plan_shards(files[::-1], copier=copier, seed=5, shuffle=shuffle, splits=splits, out_dir=tmp_path / "o",
                       bucket_files=bucket_files)  # (any order in: planned by index)
    got = {name: [[f.rel for f in plan.files(s).files] for s in shards] for name, shards in plan.shards.items()}
    assert got == _reference(files, copier=copier, seed=5, shuffle=shuffle, splits=splits)
    by_rel = {f.rel: f for f in files}
    for shards in plan.shards.values():
        for s in shards:
            assert s.nbytes == sum(by_rel[f.rel].size for f in plan.files(s).files) and s.name.endswith(".tar")
            assert plan.files(s).files == tuple(by_rel[f.rel] for f in plan.files(s).files)


def _peak(root: Path, out: Path, files: int) -> int:
    """The bytes Python allocated at most while converting ``root`` in the copy mode, in this process."""
    from shardsmith.commands.convert import ConvertOptions, job_of
    from shardsmith.engine.conduct import run_job

    opts = ConvertOptions(inputs=(str(root),), out=out, to="webdataset", workers=2, check_images="none", quiet=True,
                          format_options={"shard_samples": 100})  # (a shard's files are held while it is written)
    tracemalloc.reset_peak()
    before = tracemalloc.get_traced_memory()[0]
    manifest = run_job(job_of(opts))
    peak = tracemalloc.get_traced_memory()[1] - before  # (0 when not tracing)
    assert manifest["source"]["records"] == files
    return peak


@pytest.mark.heavy  # a measured conversion of 1,500 files with workers: `make test-heavy`
def test_the_copy_mode_holds_no_more_for_more_files(tmp_path, monkeypatch):
    """Five times the files, the same peak: every pass holds a chunk of the listing (made small
    here, so that a thousand files are many chunks), never the whole listing."""
    for module, name, value in ((file_listing, "CHUNK", 64), (copy_plan, "CHUNK", 64), (choose, "CHUNK", 64),
                                (resume, "CHUNK", 64), (folder_listing, "RUN_FILES", 64), (folder_listing, "BLOCK", 16),
                                (copy_plan, "BUCKET_FILES", 256)):
        monkeypatch.setattr(module, name, value)
    trees = {}
    for n in (50, 300, 1500):
        root = tmp_path / f"in{n}"
        for c in range(10):
            (root / f"c{c}").mkdir(parents=True)
        for i in range(n):  # (not through pathlib, which interns every name: the interpreter's table of
            # interned strings would then grow, and be resized, while a run is measured)
            with open(os.path.join(root, f"c{i % 10}", f"image-with-a-long-name-{i:06d}.jpg"), "wb") as fh:
                fh.write(b"\xff\xd8\xff\xe0\xff\xd9")
        trees[n] = root
    _peak(trees[50], tmp_path / "warm", 50)  # (imports and caches: once, untraced)
    tracemalloc.start()
    try:
        small, large = (_peak(trees[n], tmp_path / f"out{n}", n) for n in (300, 1500))
    finally:
        tracemalloc.stop()
    # the listing held whole (8ac82ac): ~1 MB more for the 1,200 more files
    assert large - small < 400_000, (small, large)
