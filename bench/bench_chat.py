"""Chat data for SFT (issue 30): `shardsmith pack-tokens --chat` against what a trainer does on the fly,
and its best-fit packing against TRL-style packing, measured in one run.

    python bench/bench_chat.py [--conversations 10000] [--seq-lens 2048,4096] [--workers 2]
                               [--out /tmp/shardsmith-bench/chat] [--repeat 1] [--checkout .] [--skip-ours]
    python bench/bench_chat.py --conversations 500 --skip-ours     # a quick check of the baseline side

Inputs, made once in --out and reused:
  * conversations: bench/chat_data.py (seed 0): OpenAI-style JSONL, 1-8 turns, messages from a few words
    to ~1,500 tokens with a long tail, ~30 % with a system prompt, ~20 % with tools (a `tools` list,
    assistant `tool_calls`, `tool` replies), some non-Latin text and emoji;
  * a tokenizer folder: a byte-level BPE (HF `tokenizers`, vocab 32,000, specials <|endoftext|>
    <|im_start|> <|im_end|> <tool_call> </tool_call>) trained on 2,000 conversations of the same
    stream that the benchmark does not use (indices from 2**20), and tokenizer_config.json with
    CHAT_TEMPLATE below: Qwen2.5-style ChatML (system prompt, tools, tool calls, tool replies) with
    `{% generation %}` around each assistant message's content, tool calls and <|im_end|> (the
    newline after <|im_end|> is not trained), as TRL's training templates mark them; eos <|im_end|>,
    pad <|endoftext|>.

Rows:
  * baseline: what TRL's SFTTrainer runs for each conversation (`assistant_only_loss=True`), in one
    process as its `dataset.map` does by default (`dataset_num_proc=None`), i.e. a trainer's loop:
    `AutoTokenizer.from_pretrained(DIR)` once (its time printed, not counted), then per conversation
    `tok.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=True,
    return_assistant_tokens_mask=True)`. Conversations/s counts the calls only (the JSONL is parsed
    before; the ids are kept as numpy arrays outside the clock): the baseline's best case. Beside it,
    the same at 2 cores assuming perfect scaling (like for like with --workers 2).
  * ours: `python -m shardsmith pack-tokens CONV -o OUT --tokenizer DIR/tokenizer.json --chat --pack
    best-fit --seq-len S --workers 2` from --checkout (PYTHONPATH), a child process from a warm page
    cache; its wall time includes start-up, reading, rendering, tokenizing, masking, packing, writing.
    Then the output is read back with `shardsmith.open` and every packed segment is matched to its
    conversation (by the digest of its ids): ids and loss_mask must equal the baseline's, truncated at
    S (`--too-long truncate`, the default), and position_ids restart at each segment.
  * packing at each S, on the baseline's lengths and masks: TRL-style first fit in arrival order
    (each conversation truncated to S as TRL's `max_length=S` does, then put in the first sequence
    with room, else a new one); best-fit decreasing as TRL's default `packing_strategy="bfd"` does
    (truncated, sorted within each `datasets.map` batch of 1,000 rows, bins not shared across
    batches); ours (the manifest's `packing` and `chat` records); two floors: ceil(tokens kept / S)
    sequences for the truncated conversations, and ceil(all tokens / S) (every token kept, split
    freely). Tokens trained on: tokens whose mask is on.

Prints markdown tables; writes every figure to OUT/results.json. MB are 10**6 bytes.
"""

from __future__ import annotations

import argparse
import bisect
import hashlib
import json
import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from chat_data import conversations, texts, write_conversations  # noqa: E402
from harness import clear, code_version, verdict, warm  # noqa: E402

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"]
VOCAB = 32_000
TRAIN_CONVERSATIONS, TRAIN_START = 2_000, 1 << 20
TRL_MAP_BATCH = 1_000  # datasets.map's default batch size, over which TRL's bfd packs
GOAL = 10.0

# Qwen2.5-style ChatML for training: the assistant's output (content, tool calls, <|im_end|>) inside
# {% generation %}, so that apply_chat_template(..., return_assistant_tokens_mask=True) masks it.
CHAT_TEMPLATE = (
    "{%- set default_system = 'You are a helpful assistant.' %}\n"
    "{%- if tools %}\n"
    "    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0].role == 'system' %}{{- messages[0].content }}{%- else %}{{- default_system }}{%- endif %}\n"
    "    {{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n'"
    " + 'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}\n"
    "    {%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}\n"
    "    {{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments'"
    " + ' within <tool_call></tool_call> XML tags:\\n<tool_call>\\n'"
    " + '{\"name\": <function-name>, \"arguments\": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}\n"
    "{%- elif messages[0].role == 'system' %}\n"
    "    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}\n"
    "{%- else %}\n"
    "    {{- '<|im_start|>system\\n' + default_system + '<|im_end|>\\n' }}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    "    {%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}\n"
    "    {%- elif message.role == 'assistant' %}\n"
    "        {{- '<|im_start|>assistant\\n' }}\n"
    "        {%- generation %}\n"
    "        {%- if message.content %}{{- message.content }}{%- endif %}\n"
    "        {%- if message.tool_calls %}\n"
    "            {%- for call in message.tool_calls %}\n"
    "                {%- set fn = call.function if call.function is defined else call %}\n"
    "                {%- if message.content or not loop.first %}{{- '\\n' }}{%- endif %}\n"
    "                {{- '<tool_call>\\n{\"name\": \"' + fn.name + '\", \"arguments\": ' + (fn.arguments | tojson)"
    " + '}\\n</tool_call>' }}\n"
    "            {%- endfor %}\n"
    "        {%- endif %}\n"
    "        {{- '<|im_end|>' }}\n"
    "        {%- endgeneration %}\n"
    "        {{- '\\n' }}\n"
    "    {%- elif message.role == 'tool' %}\n"
    "        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}\n"
    "        {{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}\n"
    "        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}\n"
)


# ---------------------------------------------------------------- inputs

def make_tokenizer(folder: Path, seed: int) -> Path:
    """DIR/tokenizer.json (byte-level BPE) and DIR/tokenizer_config.json (CHAT_TEMPLATE), once."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if (folder / "tokenizer_config.json").exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    sample = [s for rec in conversations(TRAIN_CONVERSATIONS, seed, start=TRAIN_START) for s in texts(rec)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(sample, trainer=trainer)
    tok.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": CHAT_TEMPLATE,
              "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None, "unk_token": None,
              "model_max_length": 131072, "clean_up_tokenization_spaces": False, "split_special_tokens": False}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=1, ensure_ascii=False) + "\n")
    print(f"trained {folder / 'tokenizer.json'} (vocab {tok.get_vocab_size():,}) on {len(sample):,} texts "
          f"({sum(map(len, sample)) / 1e6:.1f} M characters) in {time.perf_counter() - t0:.1f} s")
    return folder


def make_conversations(path: Path, n: int, seed: int) -> Path:
    if not path.exists():
        t0 = time.perf_counter()
        size = write_conversations(path, n, seed)
        print(f"wrote {n:,} conversations ({size / 1e6:.1f} MB) to {path} in {time.perf_counter() - t0:.1f} s")
    return path


# ---------------------------------------------------------------- the baseline: a trainer's loop

@dataclass
class Baseline:
    ids: list[np.ndarray] = field(default_factory=list)    # per conversation, int64
    masks: list[np.ndarray] = field(default_factory=list)  # per conversation, bool
    seconds: list[float] = field(default_factory=list)     # apply_chat_template calls, per repeat
    load_s: float = 0.0

    @property
    def lengths(self) -> np.ndarray:
        return np.array([len(x) for x in self.ids], dtype=np.int64)

    def trained(self, seq_len: int | None = None) -> int:
        return int(sum(int(m[:seq_len].sum()) for m in self.masks))


def run_baseline(tok_dir: Path, records: list[dict], base: Baseline | None) -> Baseline:
    """Every conversation through apply_chat_template with the assistant mask; the first run keeps
    the ids and masks, later runs (--repeat) only add their time."""
    from transformers import AutoTokenizer

    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    load = time.perf_counter() - t0
    keep = base is None
    base = base or Baseline(load_s=load)
    spent = 0.0
    clock = time.perf_counter
    for rec in records:
        t = clock()
        out = tok.apply_chat_template(rec["messages"], tools=rec.get("tools"), tokenize=True, return_dict=True,
                                      return_assistant_tokens_mask=True)
        spent += clock() - t
        if keep:
            base.ids.append(np.asarray(out["input_ids"], dtype=np.int64))
            base.masks.append(np.asarray(out["assistant_masks"], dtype=bool))
    base.seconds.append(spent)
    return base


# ---------------------------------------------------------------- packing on the baseline's lengths

def first_fit(lengths: np.ndarray, seq_len: int) -> int:
    """TRL-style greedy packing: each length truncated to seq_len, in arrival order, into the first
    sequence with room (a max segment tree over every possible sequence's free space), else a new
    one. Returns the number of sequences."""
    n = len(lengths)
    size = 1 << max(0, (n - 1).bit_length())
    tree = [seq_len] * (2 * size)
    used = 0
    for length in np.minimum(lengths, seq_len).tolist():
        i = 1
        while i < size:  # the leftmost leaf with free space >= length
            i = 2 * i if tree[2 * i] >= length else 2 * i + 1
        used = max(used, i - size + 1)
        tree[i] -= length
        i >>= 1
        while i:
            tree[i] = max(tree[2 * i], tree[2 * i + 1])
            i >>= 1
    return used


def best_fit_decreasing(lengths: np.ndarray, seq_len: int, batch: int = TRL_MAP_BATCH) -> int:
    """TRL's packing_strategy="bfd": within each batch of `batch` rows, lengths truncated to seq_len,
    longest first, each into the sequence whose free space fits it most tightly, else a new one."""
    total = 0
    for a in range(0, len(lengths), batch):
        free: list[tuple[int, int]] = []  # (free space, sequence id), sorted
        bins = 0
        for length in sorted(np.minimum(lengths[a:a + batch], seq_len).tolist(), reverse=True):
            k = bisect.bisect_left(free, (length, -1))
            if k < len(free):
                space, b = free.pop(k)
            else:
                space, b = seq_len, bins
                bins += 1
            if space - length > 0:
                bisect.insort(free, (space - length, b))
        total += bins
    return total


def packing_row(name: str, sequences: int, seq_len: int, real: int, trained: int, truncated: int | str) -> dict:
    return {"packing": name, "sequences": sequences, "padding_fraction": 1 - real / (sequences * seq_len),
            "real_tokens": real, "trained_tokens": trained, "trained_per_sequence": trained / sequences,
            "truncated": truncated}


def baseline_packing(base: Baseline, seq_len: int) -> list[dict]:
    lengths = base.lengths
    kept = int(np.minimum(lengths, seq_len).sum())
    truncated = int((lengths > seq_len).sum())
    trained = base.trained(seq_len)
    floor = math.ceil(int(lengths.sum()) / seq_len)
    return [packing_row("TRL-style first fit, arrival order (truncated to S)", first_fit(lengths, seq_len), seq_len,
                        kept, trained, truncated),
            packing_row(f"TRL bfd, best-fit decreasing per {TRL_MAP_BATCH:,} rows (truncated to S)",
                        best_fit_decreasing(lengths, seq_len), seq_len, kept, trained, truncated),
            packing_row("floor of the truncated tokens: ceil(tokens kept / S)", math.ceil(kept / seq_len), seq_len,
                        kept, trained, truncated),
            packing_row("floor: ceil(all tokens / S), split freely", floor, seq_len, int(lengths.sum()),
                        base.trained(), 0)]


# ---------------------------------------------------------------- ours

def chat_supported(checkout: Path, env: dict) -> bool:
    out = subprocess.run([sys.executable, "-P", "-m", "shardsmith", "pack-tokens", "--help"], capture_output=True,
                         text=True, env=env, cwd=checkout)
    return "--chat" in out.stdout


def run_ours(conv: Path, tok_dir: Path, out: Path, seq_len: int, workers: int, env: dict, log: Path) -> float:
    clear([out])
    cmd = [sys.executable, "-P", "-m", "shardsmith", "pack-tokens", str(conv), "-o", str(out),
           "--tokenizer", str(tok_dir / "tokenizer.json"), "--chat", "--pack", "best-fit",
           "--seq-len", str(seq_len), "--workers", str(workers), "--quiet"]
    with open(log, "wb") as err:
        t0 = time.perf_counter()
        done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env)
        wall = time.perf_counter() - t0
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}; stderr tail:\n"
                           f"{log.read_text(errors='replace')[-2000:]}")
    return wall


def _digest(a: np.ndarray) -> bytes:
    return hashlib.blake2b(np.ascontiguousarray(a, dtype=np.int64).tobytes(), digest_size=16).digest()


def check_ours(out: Path, base: Baseline, seq_len: int, checkout: Path) -> dict:
    """Read OUT back with shardsmith.open; match every packed segment to a conversation by the digest
    of its ids (the baseline's ids truncated to seq_len); compare ids, loss_mask, position_ids."""
    if str(checkout) not in sys.path:
        sys.path.insert(0, str(checkout))
    import shardsmith

    by_digest: dict[bytes, list[int]] = {}
    by_prefix: dict[bytes, list[int]] = {}
    for i, ids in enumerate(base.ids):
        by_digest.setdefault(_digest(ids[:seq_len]), []).append(i)
        by_prefix.setdefault(_digest(ids[:64]), []).append(i)
    ds = shardsmith.open(out)
    seen = np.zeros(len(base.ids), dtype=bool)
    r = {"sequences": len(ds), "segments": 0, "matched": 0, "mask_mismatch": 0, "ids_mismatch_known_prefix": 0,
         "unknown": 0, "position_mismatch": 0, "duplicates": 0, "loss_mask_sum": 0, "real_tokens": 0,
         "padding_mask_on": 0, "examples": []}
    for s in range(len(ds)):
        item = ds[s]
        tokens, mask = np.asarray(item["tokens"]), np.asarray(item["loss_mask"], dtype=bool)
        cu = np.asarray(item["cu_seqlens"]).astype(np.int64)
        pos = np.asarray(item["position_ids"]) if "position_ids" in item else None
        r["loss_mask_sum"] += int(mask.sum())
        r["real_tokens"] += int(cu[-1])
        r["padding_mask_on"] += int(mask[cu[-1]:].sum())
        for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
            r["segments"] += 1
            seg = tokens[a:b]
            if pos is not None and not np.array_equal(pos[a:b], np.arange(b - a)):
                r["position_mismatch"] += 1
            candidates = by_digest.get(_digest(seg), [])
            if candidates:  # equal conversations are interchangeable: the first not yet seen
                i = next((i for i in candidates if not seen[i]), candidates[0])
                r["duplicates"] += int(seen[i])
                seen[i] = True
                if np.array_equal(mask[a:b], base.masks[i][:seq_len]):
                    r["matched"] += 1
                else:
                    r["mask_mismatch"] += 1
                    if len(r["examples"]) < 5:
                        diff = np.flatnonzero(mask[a:b] != base.masks[i][:b - a])
                        r["examples"].append({"sequence": s, "conversation": i, "kind": "mask",
                                              "first_diff": int(diff[0]) if len(diff) else None,
                                              "ours_on": int(mask[a:b].sum()),
                                              "baseline_on": int(base.masks[i][:seq_len].sum())})
            elif _digest(seg[:64]) in by_prefix:
                r["ids_mismatch_known_prefix"] += 1
                if len(r["examples"]) < 5:
                    i = by_prefix[_digest(seg[:64])][0]
                    ref = base.ids[i][:seq_len]
                    n = min(len(ref), len(seg))
                    diff = np.flatnonzero(ref[:n] != seg[:n])
                    r["examples"].append({"sequence": s, "conversation": i, "kind": "ids", "ours_len": int(b - a),
                                          "baseline_len": len(ref), "first_diff": int(diff[0]) if len(diff) else n})
            else:
                r["unknown"] += 1
    r["conversations_found"] = int(seen.sum())
    return r


# ---------------------------------------------------------------- report

def md_table(header: list[str], rows: list[list[str]]) -> None:
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


def pct(x: float) -> str:
    return f"{100 * x:.2f} %"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--conversations", type=int, default=10_000)
    ap.add_argument("--seq-lens", default="2048,4096")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0, help="conversation and tokenizer seed")
    ap.add_argument("--repeat", type=int, default=1, help="timed runs of each side, interleaved (median)")
    ap.add_argument("--out", type=Path, default=Path("/tmp/shardsmith-bench/chat"),
                    help="inputs (made once), our outputs, results.json")
    ap.add_argument("--checkout", type=Path, default=HERE.parent, help="the shardsmith checkout to run")
    ap.add_argument("--skip-ours", action="store_true", help="baseline and packing only (before --chat exists)")
    args = ap.parse_args(argv)
    seq_lens = [int(s) for s in args.seq_lens.split(",")]
    work = args.out.resolve()
    (work / "logs").mkdir(parents=True, exist_ok=True)
    checkout = args.checkout.resolve()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the baseline loads a local folder: no hub look-ups
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    env = {**os.environ, "PYTHONPATH": str(checkout), "PYTHONWARNINGS": "ignore"}
    load_start = os.getloadavg()
    print(f"bench_chat: {args.conversations:,} conversations, S = {', '.join(map(str, seq_lens))}, --workers "
          f"{args.workers}, {os.cpu_count()} cores, load {load_start[0]:.2f}, out {work}")

    tok_dir = make_tokenizer(work / f"tokenizer-s{args.seed}", args.seed)
    conv = make_conversations(work / f"conversations-{args.conversations}-s{args.seed}.jsonl", args.conversations,
                              args.seed)
    with open(conv, "rb") as f:
        records = [orjson.loads(line) for line in f]
    n = len(records)

    ours_ok = not args.skip_ours
    note = "--skip-ours" if args.skip_ours else ""
    if ours_ok:
        version = code_version() if checkout == HERE.parent else f"checkout {checkout}"
        print(f"shardsmith under test: {version}")
        import compileall

        compileall.compile_dir(str(checkout / "shardsmith"), quiet=1)
        if not chat_supported(checkout, env):
            ours_ok, note = False, f"{checkout}: pack-tokens has no --chat"
            print(f"ours: {note}; its rows are left out")
    warm([str(conv)])

    base: Baseline | None = None
    ours_walls: dict[int, list[float]] = {s: [] for s in seq_lens}
    for _ in range(args.repeat):
        base = run_baseline(tok_dir, records, base)
        if ours_ok:
            for s in seq_lens:
                ours_walls[s].append(run_ours(conv, tok_dir, work / f"ours-{s}", s, args.workers, env,
                                              work / "logs" / f"ours-{s}.log"))
    assert base is not None
    base_s = statistics.median(base.seconds)
    base_rate = n / base_s
    lengths = base.lengths
    results: dict = {
        "date": time.strftime("%Y-%m-%d"), "cores": os.cpu_count(), "load_start": load_start,
        "conversations": n, "seed": args.seed, "workers": args.workers, "repeat": args.repeat,
        "input_bytes": conv.stat().st_size, "note": note,
        "tokens": {"total": int(lengths.sum()), "mean": float(lengths.mean()),
                   "median": float(np.median(lengths)), "p90": float(np.percentile(lengths, 90)),
                   "p99": float(np.percentile(lengths, 99)), "max": int(lengths.max()),
                   "trained": base.trained(), "with_tools": sum("tools" in r for r in records),
                   "with_system": sum(r["messages"][0]["role"] == "system" for r in records)},
        "baseline": {"seconds": base_s, "runs": base.seconds, "conversations_per_s": base_rate,
                     "tokenizer_load_s": base.load_s},
        "ours": {}, "packing": {}, "check": {},
    }
    t = results["tokens"]
    print(f"\ninput: {conv.name}, {results['input_bytes'] / 1e6:.1f} MB; {t['with_system']:,} with a system prompt, "
          f"{t['with_tools']:,} with tools; tokens per conversation (rendered) mean {t['mean']:,.0f}, median "
          f"{t['median']:,.0f}, p90 {t['p90']:,.0f}, p99 {t['p99']:,.0f}, max {t['max']:,}; all {t['total']:,} "
          f"tokens, {t['trained']:,} trained on (assistant mask) = {pct(t['trained'] / t['total'])}")

    # ---- speed
    rows = [["transformers `apply_chat_template` + assistant mask, 1 process (a trainer's loop; calls only, "
             f"load {base.load_s:.2f} s not counted)", f"{base_s:.2f}", f"{base_rate:,.0f}", "1.00"],
            [f"the same, {args.workers} processes at perfect scaling (like for like with --workers "
             f"{args.workers}; not run)", f"{base_s / args.workers:.2f}", f"{base_rate * args.workers:,.0f}",
             f"{args.workers:.2f}"]]
    for s in seq_lens:
        if not ours_ok:
            rows.append([f"shardsmith `pack-tokens --chat --pack best-fit --seq-len {s} --workers {args.workers}`",
                         "", "", note])
            continue
        wall = statistics.median(ours_walls[s])
        manifest = json.loads((work / f"ours-{s}" / "manifest.json").read_text())
        results["ours"][s] = {"wall_s": wall, "walls": ours_walls[s], "conversations_per_s": n / wall,
                              "ratio": (n / wall) / base_rate, "ratio_per_core": (n / wall) / (base_rate * args.workers),
                              "packing": manifest.get("packing"), "chat": manifest.get("chat")}
        rows.append([f"shardsmith `pack-tokens --chat --pack best-fit --seq-len {s} --workers {args.workers}` "
                     "(child process, start-up included)", f"{wall:.2f}", f"{n / wall:,.0f}",
                     f"{(n / wall) / base_rate:.2f}"])
    print(f"\nconversations to token ids + loss mask, {n:,} conversations"
          + (f", medians of {args.repeat}" if args.repeat > 1 else ", one run each"))
    md_table(["side", "s", "conversations/s", "x baseline"], rows)
    for s in seq_lens:
        if s in results["ours"]:
            o = results["ours"][s]
            verdict(f"goal >= {GOAL:g}x the trainer's loop at S = {s}", o["ratio"] >= GOAL,
                    f"{o['ratio']:.2f}x ({o['ratio_per_core']:.2f}x per core)")

    # ---- packing
    for s in seq_lens:
        prow = baseline_packing(base, s)
        if ours_ok:
            o = results["ours"][s]
            p, chat = o["packing"] or {}, o["chat"] or {}
            real = int(p.get("real_tokens", 0))
            trunc = chat.get("truncated", chat.get("conversations_truncated", "?"))
            dropped = chat.get("dropped", chat.get("conversations_dropped"))
            prow.insert(2, {"packing": "shardsmith best-fit (manifest)", "sequences": int(p.get("sequences", 0)),
                            "padding_fraction": float(p.get("padding_fraction", float("nan"))), "real_tokens": real,
                            "trained_tokens": int(chat.get("trained_tokens", 0)),
                            "trained_per_sequence": int(chat.get("trained_tokens", 0)) / max(1, int(p.get("sequences", 0))),
                            "truncated": trunc if dropped in (None, 0) else f"{trunc} (+{dropped} dropped)"})
        results["packing"][s] = prow
        print(f"\npacking at S = {s}: {int((lengths > s).sum()):,} of {n:,} conversations longer than S")
        md_table(["packing", "sequences", "padding", "tokens kept", "tokens trained on", "trained / sequence",
                  "truncated"],
                 [[r["packing"], f"{r['sequences']:,}", pct(r["padding_fraction"]), f"{r['real_tokens']:,}",
                   f"{r['trained_tokens']:,}", f"{r['trained_per_sequence']:,.0f}", f"{r['truncated']:,}"
                   if isinstance(r["truncated"], int) else str(r["truncated"])] for r in prow])

    # ---- ours read back against the baseline
    for s in seq_lens:
        if not ours_ok:
            break
        c = check_ours(work / f"ours-{s}", base, s, checkout)
        results["check"][s] = c
        expected = base.trained(s)
        print(f"\nread back, S = {s}: {c['sequences']:,} sequences, {c['segments']:,} segments; {c['matched']:,} equal "
              f"to their conversation (ids and mask), {c['mask_mismatch']:,} with another mask, "
              f"{c['ids_mismatch_known_prefix']:,} with other ids, {c['unknown']:,} unknown; "
              f"{c['conversations_found']:,} of {n:,} conversations found")
        for ex in c["examples"]:
            print(f"  e.g. {ex}")
        verdict(f"every segment equal to the baseline truncated at {s}", c["matched"] == c["segments"] == n,
                f"{c['matched']:,} of {c['segments']:,} segments, {n:,} conversations")
        trained_manifest = (results["ours"][s]["chat"] or {}).get("trained_tokens")
        verdict("sum of loss_mask == baseline's assistant tokens (truncated at S) == manifest trained_tokens",
                c["loss_mask_sum"] == expected == trained_manifest,
                f"{c['loss_mask_sum']:,} / {expected:,} / {trained_manifest}; untruncated {base.trained():,}; "
                f"{c['padding_mask_on']} padding tokens with the mask on")
        chat = results["ours"][s]["chat"] or {}
        truncated = chat.get("truncated", chat.get("conversations_truncated"))
        verdict("conversations truncated: manifest == baseline's longer than S", truncated == int((lengths > s).sum()),
                f"{truncated} / {int((lengths > s).sum()):,}")
        verdict("position_ids restart at every segment", c["position_mismatch"] == 0,
                f"{c['position_mismatch']} segments otherwise")

    load_end = os.getloadavg()
    results["load_end"] = load_end
    (work / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    print(f"\nload at end {load_end[0]:.2f}; figures in {work / 'results.json'}")


if __name__ == "__main__":
    main()
