"""``pack-tokens --chat`` as a user runs it (issue 30): conversations rendered with three real
templates (ChatML turn by turn, Llama-3 with {% generation %} blocks, Qwen2.5 with a system prompt
and tool calls) give, document by document, transformers' ``apply_chat_template`` ids and
assistant masks; packed with --too-long truncate, drop and split; the same bytes on either engine
and after a kill; the output folder's tokenizer renders the same; verify, the report, bad records
and usage errors; packed chat batches resume exactly and mix with pre-training data."""

from __future__ import annotations

import json
import os
import random
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from chat_models import TOOLS, build_models, build_tokenizers, random_conversation, transformers_answer
from conftest import make_docs, run_cli, run_subprocess, tree_digest, write_jsonl

import shardsmith
from shardsmith.text.chat import ChatFields, conversation_of, rendered

transformers = pytest.importorskip("transformers")
N = 60


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return build_models(tmp_path_factory.mktemp("models"), build_tokenizers())


def conversations(name: str, n: int = N, seed: int = 1) -> list[dict]:
    rng = random.Random(seed)
    tools = name == "qwen"
    rows = []
    for _ in range(n):
        row = {"messages": random_conversation(rng, tools=tools)}
        if tools and rng.random() < 0.7:
            row["tools"] = TOOLS
        rows.append(row)
    return rows


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def reference(model, row: dict) -> tuple[list[int], list[bool]]:
    """transformers' ids and assistant mask of a row; for a template without generation blocks, the
    mask is transformers' token offsets over the turn-by-turn spans (test_chat_kit pins those down)."""
    _, want = transformers_answer(model, row["messages"], row.get("tools"))
    if model.template.has_generation_for(tools=row.get("tools")):
        return want["input_ids"], [bool(b) for b in want["assistant_masks"]]
    text, spans = rendered(model.template, conversation_of(row, ChatFields()), train_on="assistant")
    offsets = model.reference(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    return want["input_ids"], [any(e > a and s < b for a, b in spans) for s, e in offsets]


def pack(inp: Path, out: Path, model, *args: str) -> None:
    res = run_cli("pack-tokens", inp, "-o", out, "--tokenizer", model.folder / "tokenizer.json", "--chat", "-q", *args)
    assert res.exit_code == 0, res.stderr


@pytest.mark.parametrize("name", ["chatml", "llama3", "qwen"])
def test_documents_are_transformers_ids_and_masks_sample_by_sample(tmp_path, models, name):
    model, rows = models[name], conversations(name)
    pack(write_rows(tmp_path / "in" / "c.jsonl", rows), tmp_path / "out", model, "--no-shuffle")
    docs = shardsmith.open(tmp_path / "out")
    assert len(docs) == len(rows)
    for i, row in enumerate(rows):
        ids, mask = reference(model, row)
        assert docs[i]["tokens"].tolist() == ids, (name, i)
        assert docs[i]["loss_mask"].tolist() == mask, (name, i)
    m = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert m["chat"]["conversations"] == len(rows)
    assert m["chat"]["trained_tokens"] == sum(int(docs[i]["loss_mask"].sum()) for i in range(len(docs)))
    assert sum(m["chat"]["messages"].values()) == len(rows)
    # the output folder renders as the run did
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "out")
    for i in (0, 7, 33):
        ids = tok.apply_chat_template(rows[i]["messages"], tools=rows[i].get("tools"), tokenize=True,
                                      return_dict=True)["input_ids"]
        assert ids == docs[i]["tokens"].tolist()
    assert run_cli("verify", tmp_path / "out", "--deep").exit_code == 0


def test_either_engine_writes_the_same_bytes_and_a_kill_changes_nothing(tmp_path, models):
    model = models["llama3"]
    inp = write_rows(tmp_path / "in" / "c.jsonl", conversations("llama3", 300, seed=5))
    common = ["--pack", "best-fit", "--seq-len", "64", "--pack-window", "1K", "--memory", "200KB"]
    pack(inp, tmp_path / "auto", model, *common)
    pack(inp, tmp_path / "hf", model, *common, "--engine", "hf")
    assert json.loads((tmp_path / "auto" / "manifest.json").read_text())["tokenizer"]["engine"] == "gigatoken"
    assert tree_digest(tmp_path / "auto") == tree_digest(tmp_path / "hf")
    args = ["pack-tokens", inp, "--tokenizer", model.folder / "tokenizer.json", "--chat", "-q", *common]
    for point, workers, parent in (("scatter:1", "2", {"SHARDSMITH_CRASH_PARENT": "1"}), ("gather:train:0", "1", {})):
        out = tmp_path / point.replace(":", "-")
        res = run_subprocess(*args, "--workers", workers, "-o", out,
                             env={**os.environ, "SHARDSMITH_CRASH_AT": point, **parent})
        assert res.returncode == -signal.SIGKILL, (point, res.returncode, res.stderr)
        res = run_subprocess(*args, "--workers", workers, "-o", out)
        assert res.returncode == 0, res.stderr
        assert tree_digest(out) == tree_digest(tmp_path / "auto"), point
        a = json.loads((out / "manifest.json").read_text())["chat"]
        assert a == json.loads((tmp_path / "auto" / "manifest.json").read_text())["chat"]


def segments(ds) -> list[tuple[list[int], list[bool]]]:
    out = []
    for i in range(len(ds)):
        item = ds[i]
        cu = item["cu_seqlens"].tolist()
        for a, b in zip(cu[:-1], cu[1:]):
            out.append((item["tokens"][a:b].tolist(), item["loss_mask"][a:b].tolist()))
        assert not item["loss_mask"][cu[-1]:].any()  # padding is never trained on
    return out


@pytest.mark.parametrize("too_long", ["truncate", "drop", "split"])
def test_packed_conversations_whole_cut_or_left_out(tmp_path, models, too_long):
    model, rows = models["qwen"], conversations("qwen", 80, seed=3)
    seq = 96
    pack(write_rows(tmp_path / "in" / "c.jsonl", rows), tmp_path / "out", model, "--pack", "best-fit",
         "--seq-len", str(seq), "--too-long", too_long)
    ds = shardsmith.open(tmp_path / "out")
    want = [reference(model, row) for row in rows]
    longer = [w for w in want if len(w[0]) > seq]
    assert longer and len(longer) < len(want)  # the case is exercised
    got = segments(ds)
    chat = ds.manifest["chat"]
    if too_long == "truncate":
        assert sorted(got) == sorted((ids[:seq], mask[:seq]) for ids, mask in want)
        assert chat["truncated"] == len(longer) and chat["dropped_too_long"] == 0
        assert chat["truncated_tokens"] == sum(len(ids) - seq for ids, _ in longer)
    elif too_long == "drop":
        assert sorted(got) == sorted(w for w in want if len(w[0]) <= seq)
        assert chat["dropped_too_long"] == len(longer) and ds.manifest["source"]["records"] == len(rows)
    else:  # split: every token once, pieces of at most seq
        assert sum(len(ids) for ids, _ in got) == sum(len(ids) for ids, _ in want)
        assert ds.manifest["packing"]["documents_split"] == len(longer)
    assert chat["trained_tokens"] == sum(sum(mask) for _, mask in got)
    res = run_cli("inspect", tmp_path / "out")
    assert res.exit_code == 0
    res = run_cli("verify", tmp_path / "out", "--deep")
    assert res.exit_code == 0, res.output + res.stderr


def test_pairs_train_on_the_completion(tmp_path, models):
    model = models["llama3"]
    rows = [{"prompt": f"what is {i} plus {i}?", "completion": f"It is {2 * i}."} for i in range(20)]
    pack(write_rows(tmp_path / "in" / "p.jsonl", rows), tmp_path / "out", model, "--no-shuffle",
         "--prompt-field", "prompt", "--completion-field", "completion", "--train-on", "completion")
    docs = shardsmith.open(tmp_path / "out")
    tok = model.reference
    for i, row in enumerate(rows):
        prompt = tok.apply_chat_template([{"role": "user", "content": row["prompt"]}], add_generation_prompt=True,
                                         tokenize=True, return_dict=True)["input_ids"]
        whole = tok.apply_chat_template([{"role": "user", "content": row["prompt"]},
                                         {"role": "assistant", "content": row["completion"]}],
                                        tokenize=True, return_dict=True)["input_ids"]
        assert docs[i]["tokens"].tolist() == whole and whole[:len(prompt)] == prompt
        # TRL's completion mask: every token after the prompt's
        assert docs[i]["loss_mask"].tolist() == [False] * len(prompt) + [True] * (len(whole) - len(prompt))


def test_bad_conversations_name_their_line_or_are_counted(tmp_path, models):
    model = models["llama3"]
    rows = conversations("llama3", 10)
    rows[3] = {"messages": [{"role": "wizard", "content": "hi"}]}
    rows[6] = {"text": "not a conversation"}
    inp = write_rows(tmp_path / "in" / "c.jsonl", rows)
    res = run_cli("pack-tokens", inp, "-o", tmp_path / "out", "--tokenizer", model.folder / "tokenizer.json",
                  "--chat", "-q")
    assert res.exit_code != 0 and "line 4" in res.stderr and "wizard" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr
    pack(inp, tmp_path / "skip", model, "--on-error", "skip")
    m = json.loads((tmp_path / "skip" / "manifest.json").read_text())
    assert m["source"]["skipped"]["count"] == 2 and m["chat"]["conversations"] == 8
    reasons = " ".join(r["reason"] for r in m["source"]["skipped"]["records"])
    assert "messages" in reasons


@pytest.mark.parametrize("args, words", [
    (["--too-long", "drop"], "--pack best-fit"),
    (["--train-on", "completion"], "--prompt-field"),
    (["--eos-token", "<|eot_id|>"], "--eos-token"),
    (["--prompt-field", "p"], "--completion-field"),
    (["--nanogpt"], "--nanogpt"),
])
def test_chat_options_that_contradict_are_one_line_usage_errors(tmp_path, models, args, words):
    inp = write_rows(tmp_path / "in" / "c.jsonl", conversations("llama3", 3))
    res = run_cli("pack-tokens", inp, "-o", tmp_path / "out", "--tokenizer", models["llama3"].folder / "tokenizer.json",
                  "--chat", *args)
    assert res.exit_code == 2 and words in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_no_template_and_chat_options_without_chat(tmp_path, models, bpe_tokenizer):
    inp = write_rows(tmp_path / "in" / "c.jsonl", conversations("llama3", 3))
    res = run_cli("pack-tokens", inp, "-o", tmp_path / "a", "--tokenizer", bpe_tokenizer, "--chat")
    assert res.exit_code == 2 and "no chat template" in res.stderr and "--chat-template" in res.stderr
    res = run_cli("pack-tokens", inp, "-o", tmp_path / "b", "--tokenizer", bpe_tokenizer, "--train-on", "all")
    assert res.exit_code == 2 and "--train-on" in res.stderr and "--chat" in res.stderr
    # --chat-template FILE: any tokenizer
    tpl = tmp_path / "t.jinja"
    tpl.write_text("{% for m in messages %}{{ m.role }}: {% generation %}{{ m.content }}{% endgeneration %}\n"
                   "{% endfor %}", encoding="utf-8")
    res = run_cli("pack-tokens", inp, "-o", tmp_path / "c", "--tokenizer", bpe_tokenizer, "--chat",
                  "--chat-template", tpl, "--train-on", "all", "-q")
    assert res.exit_code == 0, res.stderr
    m = json.loads((tmp_path / "c" / "manifest.json").read_text())
    assert m["chat"]["trained_fraction"] == 1.0 and m["chat"]["train_on"] == "all"
    config = json.loads((tmp_path / "c" / "tokenizer_config.json").read_text())
    assert config["chat_template"] == tpl.read_text()


# -- training: packed chat batches, resume, mixtures ----------------------------------------------

torch = pytest.importorskip("torch")
stateful = pytest.importorskip("torchdata.stateful_dataloader")


@pytest.fixture(scope="module")
def packed_chat(tmp_path_factory, models):
    root = tmp_path_factory.mktemp("packedchat")
    pack(write_rows(root / "in" / "c.jsonl", conversations("llama3", 240, seed=9)), root / "out", models["llama3"],
         "--pack", "best-fit", "--seq-len", "64", "--pack-window", "1K", "--shard-tokens", "2K")
    return root / "out"


@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated", "ignore:This DataLoader will create")
@pytest.mark.parametrize("workers", [0, 2])
def test_packed_chat_batches_resume_exactly(packed_chat, workers):
    from shardsmith.torch import PackedBatches

    ds = shardsmith.open(packed_chat)
    extra = {"prefetch_factor": 2} if workers else {}

    def loader():
        return stateful.StatefulDataLoader(PackedBatches(ds, batch_size=4, seed=3), batch_size=None,
                                           num_workers=workers, **extra)

    full = list(loader())
    assert all(b["labels"].shape == b["tokens"].shape for b in full)
    for b in full:  # labels: the token where the loss counts and the token is not a segment's first
        first = b["position_ids"] == 0
        want = torch.where(b["loss_mask"] & ~first, b["tokens"], torch.full_like(b["tokens"], -100))
        assert torch.equal(b["labels"], want)
    assert sum(int(b["loss_mask"].sum()) for b in full) > 0
    it = loader()
    head = []
    for k, batch in enumerate(it):
        head.append(batch)
        if k == 4:
            state = it.state_dict()
            break
    again = loader()
    again.load_state_dict(state)
    rest = list(again)
    joined = head + rest
    assert len(joined) == len(full)
    for a, b in zip(joined, full):
        assert all(torch.equal(a[k], b[k]) if torch.is_tensor(a[k]) else a[k] == b[k] for k in a)


@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated", "ignore:This DataLoader will create")
def test_elastic_restart_and_a_mixture_with_pretraining_data(tmp_path, packed_chat, models):
    from collections import Counter

    from shardsmith.kit.order import epoch_order
    from shardsmith.loader import mix
    from shardsmith.torch import MixBatches, PackedBatches, global_position, varlen_collate

    ds = shardsmith.open(packed_chat)

    def key(tokens: Any, bits: Any) -> tuple:  # a sequence named by its tokens and bits (both come back)
        return tuple(np.asarray(tokens).tolist()), tuple(np.asarray(bits).tolist())

    def rows(batch: dict) -> list[tuple]:
        return [key(t, m) for t, m in zip(batch["tokens"], batch["loss_mask"])]

    states, before = [], []
    for rank in range(2):  # saved at 2 ranks x 2 workers, after 3 batches of 2
        dl = stateful.StatefulDataLoader(PackedBatches(ds, batch_size=2, seed=7, rank=rank, world_size=2),
                                         batch_size=None, num_workers=2, prefetch_factor=2)
        it = iter(dl)
        before += [i for _ in range(3) for i in rows(next(it))]
        states.append(dl.state_dict())
        del it, dl
    pos = global_position(states)
    after = [i for b in PackedBatches(ds, batch_size=3, seed=7, rank=0, world_size=1, start=pos) for i in rows(b)]
    order = epoch_order(len(ds), shuffle=True, seed=7, epoch=0).tolist()
    named = [key(ds[i]["tokens"], ds[i]["loss_mask"]) for i in order]
    assert Counter(before) == Counter(named[:12])
    assert Counter(after) == Counter(named[12:12 + (len(ds) - 12) // 3 * 3])
    # a chat dataset mixed with a pre-training one made with the same tokenizer and pad
    write_jsonl(tmp_path / "docs" / "a.jsonl", make_docs(200, seed=4, max_words=50))
    pad = str(json.loads((packed_chat / "manifest.json").read_text())["packing"]["pad_id"])
    res = run_cli("pack-tokens", tmp_path / "docs", "-o", tmp_path / "pre", "--tokenizer",
                  models["llama3"].folder / "tokenizer.json", "--eos-token", "<|eot_id|>", "--pack", "best-fit",
                  "--seq-len", "64", "--pad-id", pad, "-q")
    assert res.exit_code == 0, res.stderr
    m = mix({"chat": ds, "pre": shardsmith.open(tmp_path / "pre")}, weights={"chat": 0.5, "pre": 0.5}, seed=0)
    batches = list(MixBatches(m, batch_size=8, collate=varlen_collate))
    assert batches
    for b in batches:
        real = torch.arange(64)[None, :] < b["real"][:, None]
        assert not (b["loss_mask"] & ~real).any()
    chat_rows = sum(int((~b["loss_mask"] & (torch.arange(64)[None, :] < b["real"][:, None])).any(1).sum())
                    for b in batches)
    assert chat_rows > 0  # some rows carry the chat's own masks (prompts off)


def test_inspect_and_the_report_show_the_conversations(tmp_path, packed_chat):
    pytest.importorskip("matplotlib")
    res = run_cli("inspect", packed_chat)
    assert res.exit_code == 0 and "chat: 240 conversations" in res.output, res.output
    res = run_cli("inspect", packed_chat, "--report", tmp_path / "r.html")
    assert res.exit_code == 0, res.stderr
    page = (tmp_path / "r.html" / "report.html").read_text(encoding="utf-8")
    for words in ("Conversations", "Messages per conversation", "Share of each conversation trained on",
                  "tokens trained on"):
        assert words in page, words


def test_provenance_traces_a_conversation_to_its_line(tmp_path, models):
    model, rows = models["chatml"], conversations("chatml", 30, seed=8)
    inp = write_rows(tmp_path / "in" / "c.jsonl", rows)
    pack(inp, tmp_path / "out", model, "--provenance", "--pack", "best-fit", "--seq-len", "128")
    ds = shardsmith.open(tmp_path / "out")
    doc = ds.sources(0)[0]
    assert rows[doc["record"]]["messages"][0]["content"] is not None
    res = run_cli("trace", tmp_path / "out", "0")
    assert res.exit_code == 0 and "changed" not in res.output and "missing" not in res.output, res.output
    assert f"line {doc['line']}" in res.output and '"[{' in res.output  # the conversation as read, as JSON


def test_windows_over_a_chat_dataset_are_refused_and_nothing_left_says_why(tmp_path, models):
    model = models["llama3"]
    inp = write_rows(tmp_path / "in" / "c.jsonl", conversations("llama3", 8))
    pack(inp, tmp_path / "docs", model)
    with pytest.raises(shardsmith.DatasetError, match="chat dataset"):
        shardsmith.TokenDataset(tmp_path / "docs", seq_len=16)
    res = run_cli("pack-tokens", inp, "-o", tmp_path / "none", "--tokenizer", model.folder / "tokenizer.json",
                  "--chat", "--pack", "best-fit", "--seq-len", "8", "--too-long", "drop", "-q")
    assert res.exit_code != 0 and "8 left out on purpose" in res.stderr and "--too-long" in res.stderr, res.stderr


def test_a_crafted_chat_record_is_one_line(tmp_path, packed_chat):
    import shutil

    out = tmp_path / "out"
    shutil.copytree(packed_chat, out)
    m = json.loads((out / "manifest.json").read_text())
    for bad in ({"chat": {}}, {"chat": {**m["chat"], "trained_fraction": "x"}}, {"chat": None}):
        (out / "manifest.json").write_text(json.dumps({**m, **bad}))
        for cmd in (["inspect", out], ["verify", out]):
            res = run_cli(*cmd)
            said = res.output + res.stderr
            assert res.exit_code != 0 and "Traceback" not in said and "chat" in said, (bad, said)
