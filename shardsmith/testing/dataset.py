"""The dataset half of the format contract: what ``shardsmith.open`` returns for a finished
dataset must agree with itself (random access, iteration, batches, a pickled copy) and must never
open a file outside its folder, whatever the manifest says."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from shardsmith.errors import DatasetError
from shardsmith.testing.runs import MANIFEST


def same(a: Any, b: Any) -> bool:
    """Whether two samples are equal: dicts, lists and tuples item by item, arrays by dtype, shape
    and values (NaN equal to NaN), anything else by ``==``."""
    if isinstance(a, dict) or isinstance(b, dict):
        return isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys() and all(
            same(a[k], b[k]) for k in a)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        return bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))
    if isinstance(a, list | tuple) or isinstance(b, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return bool(a == b)


def first_difference(xs: list[Any], ys: list[Any]) -> str:
    """A line saying where two lists of samples first differ (for assertion messages)."""
    if len(xs) != len(ys):
        return f"{len(xs)} samples against {len(ys)}"
    bad = next((i for i, (x, y) in enumerate(zip(xs, ys)) if not same(x, y)), None)
    return "equal" if bad is None else f"sample {bad} differs: {xs[bad]!r:.300} against {ys[bad]!r:.300}"


def batch_items(batch: Any) -> list[Any]:
    """The samples of what ``get_batch`` returned: a list of them, or a columnar batch with ``event(k)``."""
    if isinstance(batch, list | tuple):
        return list(batch)
    if hasattr(batch, "event"):
        return [batch.event(k) for k in range(len(batch))]
    raise TypeError(f"get_batch returned a {type(batch).__name__}: override batch_items to split it into samples")


def check_random_access_equals_iteration(ds: Any) -> None:
    by_index = [ds[i] for i in range(len(ds))]
    iterated = list(ds.iter(shuffle=False))
    assert len(by_index) > 0, "the dataset is empty"
    assert len(iterated) == len(by_index) and all(same(x, y) for x, y in zip(by_index, iterated)), (
        f"ds[i] for i in range(len(ds)) and ds.iter(shuffle=False) differ: {first_difference(by_index, iterated)}")


class DatasetContract:
    """Tests of the dataset a finished folder opens as; needs the ``contract_output`` fixture."""

    split: ClassVar[str] = "train"
    picklable: ClassVar[bool] = True  # whether the dataset goes to DataLoader workers (it then must pickle)

    def open_dataset(self, out: Path) -> Any:
        """The dataset the tests read: ``shardsmith.open`` of ``split`` by default."""
        import shardsmith

        return shardsmith.open(out, split=self.split)

    def batch_items(self, batch: Any) -> list[Any]:
        """What ``get_batch`` returned, as a list of samples."""
        return batch_items(batch)

    def test_random_access_equals_iteration(self, contract_output: Path) -> None:
        check_random_access_equals_iteration(self.open_dataset(contract_output))

    def test_get_batch_equals_single_access(self, contract_output: Path) -> None:
        ds = self.open_dataset(contract_output)
        n = len(ds)
        rng = np.random.default_rng(0)
        picks = [*rng.permutation(n)[:24].tolist(), 0, n - 1, 0]  # any order, repeats, both ends
        got = self.batch_items(ds.get_batch(np.asarray(picks, dtype=np.int64)))
        want = [ds[i] for i in picks]
        assert len(got) == len(want) and all(same(x, y) for x, y in zip(got, want)), (
            f"get_batch({picks}) differs from [ds[i] for i in them]: {first_difference(got, want)}")

    def test_is_a_loader_dataset_whose_ranks_share_the_epoch(self, contract_output: Path) -> None:
        """The loader's protocol (``shardsmith.plugin.Dataset``: len, ``read``, ``kind``), so ``ds.iter``,
        the torch adapters and mixtures read it: two ranks' batches of an epoch cover it once, as the
        epoch's order, equal in number."""
        from shardsmith.kit.dataset import Dataset
        from shardsmith.kit.sample_kind import SampleKind

        ds = self.open_dataset(contract_output)
        assert isinstance(ds, Dataset), f"{type(ds).__name__} is not a shardsmith.plugin.Dataset (len, read, kind)"
        assert isinstance(ds.kind, SampleKind) and ds.kind.difference(ds.kind) is None
        one = list(ds.iter(shuffle=True, seed=1, epoch=2))
        shares = [list(ds.iter(shuffle=True, seed=1, epoch=2, rank=r, world_size=2)) for r in range(2)]
        assert len(shares[0]) == len(shares[1]) == len(ds) // 2
        dealt = [x for pair in zip(*shares) for x in pair]  # single samples: rank r takes every other one
        assert len(one) == len(ds) and all(same(x, y) for x, y in zip(dealt, one)), (
            f"two ranks' samples are not the epoch's, dealt in turn: {first_difference(dealt, one[:len(dealt)])}")

    def test_refuses_a_shard_outside_its_folder(self, contract_output: Path, tmp_path: Path) -> None:
        """A manifest naming ``../x`` as a shard (the file there and whole) is a DatasetError, never read."""
        out = tmp_path / "dataset"
        shutil.copytree(contract_output, out)
        m = json.loads((out / MANIFEST).read_text())
        shard = m["splits"][self.split]["shards"][0]
        outside = tmp_path / ("x" + "".join(Path(shard["path"]).suffixes))
        shutil.copyfile(out / shard["path"], outside)
        shard["path"] = f"../{outside.name}"
        (out / MANIFEST).write_text(json.dumps(m))
        with pytest.raises(DatasetError):
            ds = self.open_dataset(out)
            for i in range(len(ds)):
                ds[i]

    def test_pickle_round_trips(self, contract_output: Path) -> None:
        if not self.picklable:
            pytest.skip(f"{type(self).__name__}.picklable is False: the dataset never goes to DataLoader workers")
        ds = self.open_dataset(contract_output)
        first = ds[0]  # opened files must not travel in the pickle
        copy = pickle.loads(pickle.dumps(ds))
        assert len(copy) == len(ds)
        picks = sorted({0, len(ds) // 2, len(ds) - 1})
        assert same(copy[0], first) and all(same(copy[i], ds[i]) for i in picks), "the unpickled dataset differs"
