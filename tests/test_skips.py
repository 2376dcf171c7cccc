"""Skipping bad samples at load time, exactly (issue 44, items 3 and 6): ``on_error="raise"`` is one
line naming the shard, the key and why; ``on_error="skip"`` replaces the sample by its first readable
substitute (a function of seed, epoch and index only), counts it against ``max_skipped`` and records it
in the state, so every road (``ds.iter`` by samples or batches, the torch adapters, any rank, worker
and resume, elastic included) gives the same samples as the uninterrupted run, skips included."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import shardsmith
from shardsmith.errors import DatasetError
from shardsmith.kit.dataset import Dataset
from shardsmith.kit.pipeline import EpochPipeline
from shardsmith.kit.rank_split import EpochLayout, EpochOrder, global_position
from shardsmith.kit.sample_kind import ListForm, SampleKind
from shardsmith.kit.skips import substitutes
from shardsmith.loader import mix

BAD = {3, 11, 19}  # samples whose .json member does not decode (shards of 7: three shards hold one each)
N = 30


def write_tar(out: Path, *, bad: set[int] = BAD, n: int = N) -> Path:
    """A small tar dataset (shards of 7 samples: ``cls`` and ``json``) whose samples in ``bad`` hold
    bytes their own decoder refuses: the manifest's sizes agree, only reading them fails."""
    import test_tar_loader as tl

    samples = [(f"k{i:03d}", [("cls", b"%d" % (i % 3)),
                              ("json", b"{not json" if i in bad else orjson.dumps({"i": i}))]) for i in range(n)]
    return tl.write_dataset(out, {"train": samples}, per_shard=7)


@pytest.fixture(scope="module")
def tar(tmp_path_factory) -> Path:
    return write_tar(tmp_path_factory.mktemp("skips") / "tar")


def ids(items: Any) -> Any:
    """The sample numbers of what a road yields (a sample, or a list of them)."""
    if isinstance(items, dict):
        return items["json"]["i"]
    return [ids(s) for s in items]


# -- raise: one line naming the shard, the key and why ------------------------------------------------

@pytest.mark.parametrize("batch_size", [None, 4])
def test_raise_is_one_line_naming_shard_key_and_reason(tar, batch_size):
    ds = shardsmith.open(tar)
    with pytest.raises(DatasetError) as err:
        list(ds.iter(shuffle=False, batch_size=batch_size))
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"{tar / 'train-000000.tar'}: sample k003: member .json"), msg
    assert "does not decode" in msg and "on_error='skip'" in msg, msg


# -- skip: replaced, counted, recorded, the same by every road -----------------------------------------

def test_skip_replaces_each_bad_sample_by_its_substitute_by_every_road(tar):
    torch_adapters = pytest.importorskip("shardsmith.torch")
    ds = shardsmith.open(tar)
    opts = {"seed": 5, "epoch": 2, "on_error": "skip", "max_skipped": 3}
    it = ds.iter(**opts)
    singles = ids(list(it))
    order = EpochOrder()(N, shuffle=True, seed=5, epoch=2)
    for p, i in enumerate(order.tolist()):  # each bad sample's place: its first readable substitute
        want = next(c for c in substitutes(N, seed=5, epoch=2, index=i) if c not in BAD) if i in BAD else i
        assert singles[p] == want
    assert len(singles) == N and not set(singles) & BAD
    assert [(e["key"], e["shard"]) for e in sorted(it.report().skipped, key=lambda e: e["index"])] == \
        [("k003", str(tar / "train-000000.tar")), ("k011", str(tar / "train-000001.tar")),
         ("k019", str(tar / "train-000002.tar"))]
    assert all("does not decode" in e["reason"] for e in it.state_dict()["skipped"])
    batches = ids(list(ds.iter(batch_size=4, **opts)))
    assert [len(b) for b in batches] == [4] * 7 + [2]  # the batch keeps its size
    assert sum(batches, []) == singles
    adapter = ids(list(torch_adapters.TarIterable(ds, batch_size=4, rank=0, world_size=1, **opts)))
    assert adapter == batches
    one = mix({"only": ds}, {"only": 1}, seed=0, shuffle=False)
    assert ids(list(one.iter(shuffle=True, batch_size=4, **opts))) == batches  # a mixture: the same pipeline
    in_order = one.iter(batch_size=4, on_error="skip", max_skipped=3)  # as MixBatches reads it
    assert ids(list(torch_adapters.MixBatches(one, batch_size=4, rank=0, world_size=1, drop_last=False,
                                              on_error="skip", max_skipped=3))) == ids(list(in_order))
    assert [e["key"] for e in in_order.report().skipped] == ["k003 (source 'only')", "k011 (source 'only')",
                                                             "k019 (source 'only')"]


def test_max_skipped_a_count_or_a_fraction_then_one_line(tar):
    ds = shardsmith.open(tar)
    for limit, allowed in ((2, 2), (0.05, 2), (0.0, 0)):  # 5 % of 30 samples: 1.5, rounded up
        it = ds.iter(shuffle=False, on_error="skip", max_skipped=limit)
        with pytest.raises(DatasetError) as err:
            list(it)
        msg = str(err.value)
        assert "\n" not in msg and f"the {allowed} that max_skipped={limit!r} allows" in msg, msg
        assert len(it.report()) == allowed
    for bad in ("many", -1, 1.5, True):
        with pytest.raises(ValueError, match="max_skipped"):
            ds.iter(on_error="skip", max_skipped=bad)
    with pytest.raises(ValueError, match="on_error"):
        ds.iter(on_error="ignore")


def test_a_state_with_skips_resumes_at_every_step_and_is_checked(tar):
    ds = shardsmith.open(tar)
    opts = {"seed": 1, "batch_size": 3, "on_error": "skip", "max_skipped": 3}
    whole = ds.iter(**opts)
    run = [ids(b) for b in whole]
    end = whole.state_dict()
    assert len(end["skipped"]) == 3
    for k in range(len(run) + 1):
        it = ds.iter(**opts)
        got = [ids(next(it)) for _ in range(k)]
        state = json.loads(json.dumps(it.state_dict()))
        again = ds.iter(**opts)
        again.load_state_dict(state)
        assert got + [ids(b) for b in again] == run
        assert again.state_dict() == end
    lying = {**end, "skipped": [{**end["skipped"][0], "index": -1}]}
    with pytest.raises(ValueError, match="'skipped' record field 'index'"):
        ds.iter(**opts).load_state_dict(lying)


def test_a_jpeg_that_does_not_decode_is_skipped_with_the_same_record_every_run(tmp_path):
    pytest.importorskip("PIL")
    import test_tar_loader as tl
    from conftest import jpeg

    samples = [(f"img{i:02d}", [("jpg", b"\0\0" + jpeg(i)[2:] if i == 5 else jpeg(i)), ("cls", b"%d" % (i % 2))])
               for i in range(12)]
    ds = shardsmith.open(tl.write_dataset(tmp_path / "jpegs", {"train": samples}, per_shard=5), decode="pil")
    records = []
    for _ in range(2):
        it = ds.iter(seed=0, batch_size=4, on_error="skip", max_skipped=1)
        assert [len(b) for b in it] == [4, 4, 4]
        records.append(it.state_dict()["skipped"])
    (record,) = records[0]
    assert record["key"] == "img05" and "does not decode (UnidentifiedImageError" in record["reason"], record
    assert " at 0x" not in record["reason"] and records[0] == records[1]  # no memory address: the same bytes



def test_tar_samples_by_the_datasets_own_walk_count_and_resume_at_every_step_with_skips(tar):
    """Single tar samples go by the dataset's own walk (``samples_mended``: it mends in place and counts
    what it hands over): a state at every step counts the samples taken, resumes to the rest of the run,
    and a state carried into the next epoch gives its rest and then that epoch, as batches would."""
    ds = shardsmith.open(tar)
    assert ds.samples_mended is not None  # the road tested here
    opts = {"seed": 3, "on_error": "skip", "max_skipped": 3}
    run, after = (ids(list(ds.iter(epoch=e, **opts))) for e in (1, 2))
    assert run == sum(ids(list(ds.iter(epoch=1, batch_size=5, **opts))), [])
    whole = ds.iter(epoch=1, **opts)
    list(whole)
    for k in range(N + 1):
        it = ds.iter(epoch=1, **opts)
        head = [ids(next(it)) for _ in range(k)]
        state = json.loads(json.dumps(it.state_dict()))
        assert state["produced"] == k
        again = ds.iter(epoch=1, **opts)
        again.load_state_dict(state)
        assert head + ids(list(again)) == run and again.state_dict() == whole.state_dict()
        carried = ds.iter(epoch=1, **opts)
        carried.load_state_dict(state)
        carried.set_epoch(2)
        rest = [ids(next(carried)) for _ in range(N - k + 3)]
        assert head + rest == run + after[:3]
        assert carried.state_dict()["produced"] == 3 and carried.state_dict()["epoch"] == 2

# -- a shard of another size than the manifest's: refused at open, or skipped ------------------------

def test_a_shard_of_another_size_is_refused_or_its_samples_skipped(tmp_path):
    folder = write_tar(tmp_path / "grown", bad=set())
    shard = folder / "train-000001.tar"
    shard.write_bytes(shard.read_bytes() + bytes(1024))
    with pytest.raises(DatasetError, match="as the manifest says"):
        shardsmith.open(folder)
    ds = shardsmith.open(folder, on_error="skip")
    with pytest.raises(DatasetError) as err:  # opened, but its reads of that shard refused, in one line
        list(ds.iter(shuffle=False))
    # (a version-1 offset index holds no keys: a shard that cannot be read names its samples by number)
    assert str(err.value).startswith(f"{shard}: sample #0: missing or not 20480 bytes as the manifest says"), err.value
    it = ds.iter(seed=2, on_error="skip", max_skipped=10)
    got = ids(list(it))
    skipped = sorted(e["index"] for e in it.report().skipped)
    assert skipped == list(range(7, 14)) and not set(got) & set(skipped) and len(got) == N


# -- verify="sample": against the hash a writer recorded per sample ----------------------------------

class Hashed(Dataset):
    """A plugin's dataset whose writer recorded a sha256 per sample (what ``verify="sample"`` checks);
    sample ``i`` is bytes, one of them changed since it was written."""

    def __init__(self, blobs: list[bytes], digests: list[str]) -> None:
        self.blobs, self.digests, self.out_dir = blobs, digests, "hashed"

    @property
    def kind(self) -> SampleKind:
        return SampleKind("blobs", ListForm())

    def __len__(self) -> int:
        return len(self.blobs)

    def read(self, indices: Any) -> list[bytes]:
        return [self.blobs[i] for i in np.asarray(indices).reshape(-1).tolist()]

    def verify_samples(self, indices: np.ndarray) -> None:
        for i in indices.tolist():
            if hashlib.sha256(self.blobs[i]).hexdigest() != self.digests[i]:
                raise DatasetError("hashed: sha256 differs from the one recorded for it")


def test_verify_sample_checks_a_recorded_hash_and_is_refused_where_none_is():
    blobs = [b"blob %d" % i for i in range(12)]
    digests = [hashlib.sha256(b).hexdigest() for b in blobs]
    blobs[4] = b"changed"
    ds = Hashed(blobs, digests)
    assert len(list(ds.iter(batch_size=3))) == 4  # not asked: not checked
    with pytest.raises(DatasetError, match="^hashed: sample #4: sha256 differs from the one recorded for it"):
        list(ds.iter(batch_size=3, verify="sample"))
    it = ds.iter(verify="sample", on_error="skip", max_skipped=1)
    assert b"changed" not in list(it) and [e["index"] for e in it.report().skipped] == [4]


def test_verify_sample_is_refused_for_a_format_that_records_no_hash(tar):
    with pytest.raises(ValueError, match="TarDataset records no hash per sample"):
        shardsmith.open(tar).iter(verify="sample")


# -- hypothesis over the pipeline: every road, every resume, elastic -----------------------------------

class Numbers(Dataset):
    """Sample i is the number i; those in ``bad`` raise when read, as a sample that does not decode."""

    def __init__(self, n: int, bad: set[int]) -> None:
        self.n, self.bad = n, frozenset(bad)

    @property
    def kind(self) -> SampleKind:
        return SampleKind("numbers", ListForm())

    def __len__(self) -> int:
        return self.n

    def read(self, indices: Any) -> list[int]:
        out = np.asarray(indices).reshape(-1).tolist()
        for i in out:
            if i in self.bad:
                raise DatasetError(f"numbers.bin: sample {i} does not decode")
        return out

    def origin(self, i: int) -> tuple[str, str]:
        return "numbers.bin", f"n{i}"


class Worker(EpochPipeline):
    """The pipeline as DataLoader worker ``w`` of ``workers`` runs it (what ``shardsmith.torch.Batches`` is)."""

    def __init__(self, *args: Any, stream: tuple[int, int], **kw: Any) -> None:
        self.stream = stream
        super().__init__(*args, **kw)

    def _stream(self) -> tuple[int, int]:
        return self.stream


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(2, 40), bad=st.sets(st.integers(0, 39), max_size=8), batch_size=st.sampled_from([None, 1, 2, 3]),
       block=st.sampled_from([None, 1, 4]), world=st.integers(1, 3), workers=st.integers(1, 3),
       shuffle=st.booleans(), seed=st.integers(0, 99), epoch=st.integers(0, 3), drop_last=st.booleans(),
       at=st.integers(0, 20), world2=st.integers(1, 3), batch2=st.sampled_from([1, 2, 4]))
def test_every_road_and_every_resume_give_the_same_samples_with_skips(n, bad, batch_size, block, world, workers,
                                                                       shuffle, seed, epoch, drop_last, at, world2,
                                                                       batch2):
    """Any size, skip set, order (a permutation or shuffled blocks), ranks, workers and batch size: each
    position of the epoch's order holds its sample or that sample's first readable substitute, whichever
    road reads it (``ds.iter`` by samples or batches, DataLoader workers, a one-source mixture); a resume
    at every step gives the rest of the run and its skip records; a global position taken at any step
    starts another world size and batch size on the same samples."""
    bad = {b for b in bad if b < n}
    assume(2 * len(bad) < n)
    ds, order = Numbers(n, bad), EpochOrder(block)
    common = {"shuffle": shuffle, "seed": seed, "epoch": epoch, "on_error": "skip", "max_skipped": n}
    ref = list(ds.walk(order=order, **common, rank=0, world_size=1, batch_size=None, drop_last=False))
    visit = order(n, shuffle=shuffle, seed=seed, epoch=epoch)[0:n].tolist()
    assert ref == [next(c for c in substitutes(n, seed=seed, epoch=epoch, index=i) if c not in bad) if i in bad
                   else i for i in visit]  # each position: its sample, or its first readable substitute
    states = []
    for rank in range(world):
        layout = EpochLayout(total=n, start=0, batch_size=batch_size, rank=rank, world_size=world, drop_last=drop_last)
        want = [[ref[p] for p in range(*layout.positions(s).indices(n))] for s in range(layout.steps)]
        opts = {**common, "rank": rank, "world_size": world, "batch_size": batch_size, "drop_last": drop_last}
        got = list(ds.walk(order=order, **opts))
        assert got == (want if batch_size else sum(want, []))
        streams = [list(Worker(ds, order=order, stream=(w, workers), start=None, **opts)._run())
                   for w in range(workers)]
        assert [streams[s % workers][s // workers] for s in range(len(got))] == got  # workers take steps in turn
        if block is None:  # a mixture of this one source, read as any dataset: the same samples
            one = mix({"only": ds}, {"only": 1}, seed=0, shuffle=False)
            assert list(one.iter(**opts)) == got
        whole = ds.walk(order=order, **opts)
        list(whole)
        for k in range(len(got) + 1):  # resume at every step: the rest, and the same records at the end
            it = ds.walk(order=order, **opts)
            head = [next(it) for _ in range(k)]
            if k == min(at, len(got)):
                states.append(it.state_dict())
            again = ds.walk(order=order, **opts)
            again.load_state_dict(json.loads(json.dumps(it.state_dict())))
            assert head + list(again) == got
            assert again.state_dict() == whole.state_dict()
    if batch_size:
        start = global_position(states)  # elastic: another world size and batch size from there
        assert sorted(e["index"] for e in start["skipped"]) == sorted(set(visit[:start["position"]]) & bad)
        for rank in range(world2):
            layout = EpochLayout(total=n, start=start["position"], batch_size=batch2, rank=rank, world_size=world2,
                                 drop_last=False)
            want = [[ref[p] for p in range(*layout.positions(s).indices(n))] for s in range(layout.steps)]
            opts = {**common, "rank": rank, "world_size": world2, "batch_size": batch2, "drop_last": False}
            assert list(ds.walk(order=order, **opts, start=start)) == want


# -- a real StatefulDataLoader with 2 workers, SIGKILLed mid-epoch, resumed in a fresh process ---------

RUN = r"""
import json, os, signal, sys
from torchdata.stateful_dataloader import StatefulDataLoader
import shardsmith
from shardsmith.torch import TarIterable, skip_report

folder, saved, log, kill_at = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
ds = shardsmith.open(folder)
adapter = TarIterable(ds, batch_size=3, seed=4, on_error="skip", max_skipped=3, collate=lambda b: [s["json"]["i"] for s in b])
loader = StatefulDataLoader(adapter, batch_size=None, num_workers=2, snapshot_every_n_steps=2)
if os.path.exists(saved):
    with open(saved) as f:
        loader.load_state_dict(json.load(f))
with open(log, "a") as out:
    for step, batch in enumerate(loader, 1):
        out.write(json.dumps(batch) + "\n")
        out.flush()
        state = loader.state_dict()
        with open(saved + ".tmp", "w") as f:
            json.dump(state, f)
        os.replace(saved + ".tmp", saved)
        if step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)  # no exception, no cleanup: the process is gone
    out.write(json.dumps({"skipped": skip_report(loader.state_dict()).as_dict()["samples"]}) + "\n")
"""


@pytest.mark.heavy  # two fresh processes importing torch: `make test-heavy`
def test_stateful_dataloader_killed_mid_epoch_resumes_exactly_with_skips(tar, tmp_path):
    """The uninterrupted run is ``ds.iter``'s (the adapter's own batches by every road, above); the
    loader is SIGKILLed after 4 of its 10 batches and a fresh process resumes from its last state."""
    pytest.importorskip("torchdata.stateful_dataloader")
    whole = shardsmith.open(tar).iter(seed=4, batch_size=3, on_error="skip", max_skipped=3)
    want = [*ids(list(whole)), {"skipped": sorted(whole.report().as_dict()["samples"], key=lambda e: e["index"])}]
    script, state, log = tmp_path / "run.py", tmp_path / "state.json", tmp_path / "run.log"
    script.write_text(RUN)

    def run(kill_at: int) -> int:  # output to files: workers outliving a killed parent hold no pipe open
        with open(tmp_path / "stderr", "a") as err:
            return subprocess.run([sys.executable, str(script), str(tar), str(state), str(log), str(kill_at)],
                                  stdout=err, stderr=err, timeout=300).returncode

    assert run(4) == -signal.SIGKILL, (tmp_path / "stderr").read_text()
    assert len(log.read_text().splitlines()) == 4
    assert run(0) == 0, (tmp_path / "stderr").read_text()  # a fresh process, from the last state saved
    got = [json.loads(line) for line in log.read_text().splitlines()]
    assert got == want
    batches, report = want[:-1], want[-1]["skipped"]
    assert len(batches) == 10 and all(len(b) == 3 for b in batches)
    assert [e["key"] for e in report] == ["k003", "k011", "k019"]
    assert not {i for b in batches for i in b} & BAD
