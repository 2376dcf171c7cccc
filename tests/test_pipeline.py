"""The one loader pipeline (issue 44, items 1 and 2): every format's dataset implements one protocol
(``kit/dataset.py``), and ``ds.iter``, the kind's torch adapter (in the process, and through
torchdata's ``StatefulDataLoader`` at 0 and 2 workers) and a one-source mixture give the same samples
for the same rank, seed and epoch; a resume at every step gives the rest of the uninterrupted run;
states of the previous versions load where they name the same samples, or are refused in one line."""

from __future__ import annotations

import json
import warnings
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shardsmith
from shardsmith.formats.hdf5.dataset import block_order
from shardsmith.kit.dataset import Dataset
from shardsmith.kit.event_batch import EventBatch
from shardsmith.kit.rank_split import EpochOrder
from shardsmith.kit.sample_kind import ListForm, SampleKind
from shardsmith.loader import mix
from tests.test_torch_resume import token_dataset

torch = pytest.importorskip("torch")
stateful = pytest.importorskip("torchdata.stateful_dataloader")
pytestmark = [pytest.mark.filterwarnings("ignore:'set_vital' is deprecated"),
              pytest.mark.filterwarnings("ignore:This DataLoader will create")]
import shardsmith.torch as adapters  # noqa: E402

L = 4  # token windows' length: window i's x starts with token i·L
KINDS = ["windows", "documents", "packed", "tar", "events", "memmap", "event_tar"]


@pytest.fixture(scope="module")
def data(tmp_path_factory, bpe_tokenizer) -> dict[str, Any]:
    """One small dataset of every kind (a few dozen samples each, several shards)."""
    import test_hdf5_writer as hw
    import test_tar_loader as tl
    from conftest import make_docs, run_cli, write_jsonl
    from test_contracts import pulses

    root = tmp_path_factory.mktemp("pipeline")
    write_jsonl(root / "docs" / "a.jsonl", make_docs(60, seed=3, max_words=40))
    res = run_cli("pack-tokens", root / "docs", "-o", root / "packed", "--tokenizer", bpe_tokenizer, "--pack",
                  "best-fit", "--seq-len", "32", "--pack-window", "1K", "--shard-tokens", "400", "-q")
    assert res.exit_code == 0, res.stderr
    pulses(root / "pulses", events=10, seed=5)
    for to, extra in (("memmap", ["--max-len", "5"]), ("webdataset", ["--shard-samples", "6", "--events-per-sample",
                                                                      "1"])):
        res = run_cli("convert", root / "pulses", "-o", root / to, "--to", to, "--group-by", "event_id", *extra, "-q")
        assert res.exit_code == 0, res.stderr
    made = {"windows": shardsmith.TokenDataset(token_dataset(root / "tokens", windows=29)),
            "documents": shardsmith.loader.TokenDocuments(token_dataset(root / "doc", windows=40, shards=13)),
            "packed": shardsmith.open(root / "packed"),
            "tar": shardsmith.open(tl.write_dataset(root / "tar", {"train": tl.make_samples(23, "t")}, per_shard=7)),
            "events": shardsmith.open(hw.write_dataset(root / "h5", {"train": hw.make_events(41, seed=2)},
                                                       shard_samples=16)),
            "memmap": shardsmith.open(root / "memmap"),
            "event_tar": shardsmith.open(root / "webdataset")}
    kinds = {name: ds.kind.name for name, ds in made.items()}
    sizes = {name: len(ds) for name, ds in made.items()}
    assert len(set(kinds.values())) == len(KINDS) and min(sizes.values()) >= 12, (kinds, sizes)
    return made


# -- what each road yields, made comparable ------------------------------------------------------------

def canon(item: Any) -> Any:
    """A sample or batch as nested tuples of plain values (tensors and arrays by dtype, shape and bytes)."""
    if isinstance(item, torch.Tensor):
        item = item.numpy()
    if isinstance(item, np.ndarray):
        return ("array", item.dtype.str, item.shape, item.tobytes())
    if isinstance(item, EventBatch):
        return ("events", *(canon(item.event(k)) for k in range(len(item))))
    if isinstance(item, dict):
        return ("dict", *((k, canon(v)) for k, v in sorted(item.items())))
    if isinstance(item, list | tuple):
        return ("seq", *(canon(v) for v in item))
    if isinstance(item, np.generic):
        return item.item()
    return item


def options(kind: str, block: int | None) -> tuple[dict[str, Any], EpochOrder]:
    """``ds.iter``'s order options and the order they make (blocks of events, else a permutation)."""
    if kind != "events":
        return {}, EpochOrder()
    return {"block": block or 1, "exact": block is None}, block_order(block or 1, block is None)


def adapter(kind: str, ds: Any, order: EpochOrder, **opts: Any) -> Any:
    """The kind's torch adapter (what a user picks for it)."""
    if kind == "windows":
        return adapters.TokenBatches(ds, **opts)
    if kind == "packed":
        return adapters.PackedBatches(ds, **opts)
    if kind == "tar":
        return adapters.TarIterable(ds, **opts)
    if kind == "events":
        return adapters.EventBatches(ds, block=order.block or 1, exact=order.block is None, **opts)
    if kind == "memmap":
        return adapters.MemmapBatches(ds, **opts)
    if kind == "event_tar":
        return adapters.EventTarBatches(ds, **opts)
    return adapters.Batches(ds, **opts)


def as_adapter_gives(kind: str, item: Any) -> Any:
    """What the kind's adapter makes of a ``ds.iter`` item: tensors of arrays, varlen batches of packed
    sequences, everything else as it is."""
    if kind == "packed":
        return adapters.varlen_collate(item)
    if kind in ("windows", "memmap"):
        return adapters._to_torch(item)
    return item


def one_source(ds: Any) -> Any:
    """``ds`` as a mixture of one source, read in its own order (``shuffle=False``)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return mix({"only": ds}, {"only": 1}, seed=0, shuffle=False)


def through_json(state: dict) -> dict:
    return json.loads(json.dumps(state))


layouts = st.fixed_dictionaries({
    "kind": st.sampled_from(KINDS), "shuffle": st.booleans(), "seed": st.integers(0, 2**20),
    "epoch": st.integers(0, 3), "world": st.integers(1, 3), "rank": st.integers(0, 2),
    "batch": st.one_of(st.none(), st.integers(1, 5)), "drop_last": st.booleans(),
    "block": st.one_of(st.none(), st.integers(1, 9))})


def unpack(case: dict[str, Any]) -> tuple[str, dict[str, Any], dict[str, Any], EpochOrder]:
    kind = case["kind"]
    batch = case["batch"] if case["batch"] is not None or kind != "packed" else 3  # varlen batches: batched only
    common = {"shuffle": case["shuffle"], "seed": case["seed"], "epoch": case["epoch"],
              "rank": case["rank"] % case["world"], "world_size": case["world"], "batch_size": batch,
              "drop_last": case["drop_last"]}
    extra, order = options(kind, case["block"])
    return kind, common, extra, order


# -- every road, and a resume at every step, in this process ------------------------------------------

@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=layouts)
def test_every_road_gives_the_same_samples_and_resumes_at_every_step(data, case):
    kind, common, extra, order = unpack(case)
    ds = data[kind]
    reference = [canon(x) for x in ds.iter(**common, **extra)]
    n = len(ds)
    batch, world = common["batch_size"] or 1, common["world_size"]
    steps = n // (world * batch) + (0 if common["drop_last"] or common["batch_size"] is None
                                    else int((n % (world * batch)) // world > 0))
    assert len(reference) == steps
    # the one-source mixture, read by the same pipeline in the same order
    assert [canon(x) for x in one_source(ds).walk(order=order, **common)] == reference
    # the kind's torch adapter, iterated in this process
    made = adapter(kind, ds, order, **{k: v for k, v in common.items() if k not in ("rank", "world_size")},
                   rank=common["rank"], world_size=world)
    assert [canon(x) for x in made] == [canon(as_adapter_gives(kind, x)) for x in
                                        ds.iter(**common, **extra)]
    # resume after every step, through a JSON checkpoint
    for k in range(len(reference) + 1):
        it = ds.iter(**common, **extra)
        head = [canon(next(it)) for _ in range(k)]
        again = ds.iter(**common, **extra)
        again.load_state_dict(through_json(it.state_dict()))
        assert head + [canon(x) for x in again] == reference, k


# -- through StatefulDataLoader, 0 and 2 workers ---------------------------------------------------

def loader(made: Any, workers: int) -> Any:
    extra = {"prefetch_factor": 2} if workers else {}
    return stateful.StatefulDataLoader(made, batch_size=None, num_workers=workers, **extra)


@settings(max_examples=7, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=layouts, workers=st.sampled_from([0, 2]), stop=st.floats(0, 1))
def test_the_dataloader_gives_ds_iters_samples_and_resumes(data, case, workers, stop):
    """The adapter under a StatefulDataLoader: ``ds.iter``'s samples for any ``num_workers``; resumed
    from its state after any step, the rest of that run (0 workers: after every step)."""
    kind, common, extra, order = unpack(case)
    ds = data[kind]
    opts = {k: v for k, v in common.items() if k not in ("rank", "world_size")}

    def make() -> Any:
        return loader(adapter(kind, ds, order, rank=common["rank"], world_size=common["world_size"], **opts), workers)

    expect = [canon(as_adapter_gives(kind, x)) for x in ds.iter(**common, **extra)]
    dl = make()
    it = iter(dl)
    got, states = [], [through_json(dl.state_dict())]
    for item in it:
        got.append(canon(item))
        states.append(through_json(dl.state_dict()))
    assert got == expect
    for k in range(len(got) + 1) if workers == 0 else [int(stop * len(got))]:
        resumed = make()
        resumed.load_state_dict(states[k])
        assert [canon(x) for x in resumed] == expect[k:], k


# -- the protocol is all a plugin's dataset needs ------------------------------------------------------

class Squares(Dataset):
    """A plugin's dataset in a few lines: sample i is {"i": i, "square": i * i}."""

    kind = SampleKind("squares", ListForm())

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def read(self, indices: Any) -> list[dict[str, int]]:
        return [{"i": int(i), "square": int(i) ** 2} for i in np.asarray(indices).reshape(-1)]


def test_a_plugin_dataset_gets_iter_adapters_and_mixtures():
    ds = Squares(30)
    assert ds[4] == {"i": 4, "square": 16}  # sample 0 of read([4]), by its form
    singles = [s["i"] for s in ds.iter(seed=2, rank=1, world_size=2)]
    assert singles == shardsmith.kit.order.epoch_order(30, shuffle=True, seed=2, epoch=0)[1::2].tolist()
    batches = [[s["i"] for s in b] for b in ds.iter(seed=2, batch_size=4, rank=1, world_size=2)]
    order = shardsmith.kit.order.epoch_order(30, shuffle=True, seed=2, epoch=0)
    assert batches[:3] == [order[4:8].tolist(), order[12:16].tolist(), order[20:24].tolist()]
    got = [[s["i"] for s in b] for b in loader(adapters.Batches(ds, batch_size=4, seed=2, rank=1, world_size=2), 2)]
    assert got == batches[:3]  # drop_last: the adapters' default
    m = mix({"a": ds, "b": Squares(10)}, {"a": 3, "b": 1}, seed=1, num_samples=20)
    assert len(m.read(np.arange(20))) == 20 and m.kind == ds.kind
    with pytest.raises(shardsmith.UsageError, match="not a loader dataset") as err:
        mix({"a": ds, "b": [1, 2, 3]}, {"a": 1, "b": 1}, seed=0)
    assert "\n" not in str(err.value)
    with pytest.raises(TypeError, match="not a list"):
        adapters.Batches([1, 2, 3], batch_size=2)


def test_mixing_other_kinds_is_refused_by_name(data):
    with pytest.raises(shardsmith.UsageError, match="memmap events against tar samples") as err:
        mix({"tar": data["tar"], "mm": data["memmap"]}, {"tar": 1, "mm": 1}, seed=0)
    assert "\n" not in str(err.value)


# -- states of the previous versions -------------------------------------------------------------------

# saved by 3638d7b: StatefulDataLoader(TokenBatches(ds, batch_size=3, seed=4, epoch=1, rank=0, world_size=1),
# num_workers=2) after 4 batches, over token_dataset(windows=37); the rest it then yielded (x[:, 0])
V1 = json.loads('{"_snapshot": {"_snapshot_step": 4, "_last_yielded_worker_id": 1, "_main_snapshot": {"_num_workers": '
                '2, "_sampler_iter_state": null, "_index_sampler_state": null, "_sampler_iter_yielded": 4, '
                '"_IterableDataset_len_called": null, "_shared_seed": null, "_base_seed": 3680494384467107340}, '
                '"_worker_snapshots": {"worker_0": {"worker_id": 0, "dataset_state": {"shardsmith": '
                '"shardsmith.epoch/1", "length": 37, "order": "permutation", "shuffle": true, "seed": 4, '
                '"batch_size": 3, "world_size": 1, "drop_last": true, "rank": 0, "workers": 2, "worker": 0, "epoch": '
                '1, "start": 0, "shift": 0, "produced": 2}, "fetcher_state": {"fetcher_ended": false, '
                '"dataset_iter_state": null}}, "worker_1": {"worker_id": 1, "dataset_state": {"shardsmith": '
                '"shardsmith.epoch/1", "length": 37, "order": "permutation", "shuffle": true, "seed": 4, '
                '"batch_size": 3, "world_size": 1, "drop_last": true, "rank": 0, "workers": 2, "worker": 1, "epoch": '
                '1, "start": 0, "shift": 0, "produced": 2}, "fetcher_state": {"fetcher_ended": false, '
                '"dataset_iter_state": null}}}}, "_steps_since_snapshot": 0, "_iterator_finished": false}')
V1_REST = [[32, 120, 60], [100, 4, 76], [40, 0, 116], [88, 48, 56], [108, 80, 92], [112, 132, 36], [28, 72, 52],
           [64, 136, 104]]
# ds.iter states of 3638d7b (no version) over the same dataset, and what that ds.iter yielded next
ITER_ONE_RANK = {"shuffle": True, "seed": 4, "epoch": 1, "rank": 0, "world_size": 1, "batch_size": 3,
                 "drop_last": False, "position": 12, "length": 37}
ITER_ONE_RANK_REST = V1_REST + [[24]]
ITER_SINGLES = {"shuffle": True, "seed": 4, "epoch": 1, "rank": 1, "world_size": 2, "batch_size": None,
                "drop_last": False, "position": 5, "length": 37}
ITER_SINGLES_REST = [124, 120, 100, 76, 0, 88, 56, 80, 112, 36, 72, 64, 104]
ITER_STRIDED_BATCHES = {"shuffle": True, "seed": 4, "epoch": 1, "rank": 1, "world_size": 2, "batch_size": 3,
                        "drop_last": False, "position": 3, "length": 37}


@pytest.fixture(scope="module")
def tokens37(tmp_path_factory) -> shardsmith.TokenDataset:
    return shardsmith.TokenDataset(token_dataset(tmp_path_factory.mktemp("t37"), windows=37))


def test_a_state_the_adapters_saved_before_loads_and_resumes_exactly(tokens37):
    dl = loader(adapters.TokenBatches(tokens37, batch_size=3, seed=4, epoch=1, rank=0, world_size=1), 2)
    dl.load_state_dict(V1)
    assert [b[0][:, 0].tolist() for b in dl] == V1_REST
    assert adapters.global_position(V1)["position"] == 12


def test_ds_iter_states_of_before_load_where_they_name_the_same_samples(tokens37):
    it = tokens37.iter(seed=4, epoch=1, batch_size=3)
    it.load_state_dict(ITER_ONE_RANK)
    assert [x[:, 0].tolist() for x, _ in it] == ITER_ONE_RANK_REST
    it = tokens37.iter(seed=4, epoch=1, rank=1, world_size=2)
    it.load_state_dict(ITER_SINGLES)
    assert [int(x[0]) for x, _ in it] == ITER_SINGLES_REST
    it = tokens37.iter(seed=4, epoch=1, batch_size=3, rank=1, world_size=2)
    with pytest.raises(ValueError, match="no version") as err:  # strided batches: other samples now
        it.load_state_dict(ITER_STRIDED_BATCHES)
    assert "\n" not in str(err.value) and "shardsmith.epoch/2" in str(err.value)


def test_a_state_of_another_version_is_refused_naming_it(tokens37):
    it = tokens37.iter(seed=4, batch_size=3)
    next(it)
    state = it.state_dict()
    assert state["shardsmith"] == "shardsmith.epoch/2" and state["skipped"] == []
    for version in ("shardsmith.epoch/3", "shardsmith.epoch/0"):
        with pytest.raises(ValueError, match=f"version '{version}'") as err:
            tokens37.iter(seed=4, batch_size=3).load_state_dict({**state, "shardsmith": version})
        assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="skipped"):
        tokens37.iter(seed=4, batch_size=3).load_state_dict({**state, "skipped": [[3, "bad"]]})


def test_ds_iter_and_the_adapter_split_ranks_alike(tokens37):
    """The issue's case: ``rank=`` gave ds.iter a stride of the order and the adapters runs of batches."""
    for rank in range(3):
        ours = [x[:, 0].tolist() for x, _ in tokens37.iter(seed=4, batch_size=2, rank=rank, world_size=3,
                                                          drop_last=True)]
        theirs = [x[:, 0].tolist() for x, _ in adapters.TokenBatches(tokens37, batch_size=2, seed=4, rank=rank,
                                                                     world_size=3)]
        assert ours == theirs and len(ours) == 37 // 6


def test_a_dropped_iterator_lets_go_of_its_dataset(tmp_path):
    """An iteration left mid-epoch keeps no reference cycle: its dataset (and files) go with it."""
    import gc
    import weakref

    import test_hdf5_writer as hw

    ds = shardsmith.open(hw.write_dataset(tmp_path / "h5", {"train": hw.make_events(40, seed=1)}, shard_samples=16))
    it = ds.iter(seed=1, batch_size=4)
    next(it)
    gone = weakref.ref(ds)
    gc.disable()
    try:
        del ds, it
        assert gone() is None
    finally:
        gc.enable()

