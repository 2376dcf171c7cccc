"""Deterministic synthetic chat conversations (OpenAI-style JSONL) for the chat benchmark (issue 30).

    python bench/chat_data.py -o /tmp/conv.jsonl [--conversations 10000] [--seed 0]

Each line is ``{"messages": [...]}`` and, for conversations with tools, ``"tools": [...]`` (JSON-schema
functions, ``{"type": "function", "function": {"name", "description", "parameters"}}``). Messages are
``{"role", "content"}``; an assistant message that calls tools has ``"tool_calls": [{"id", "type":
"function", "function": {"name", "arguments": {...}}}]`` and ``"content": null`` (or a short preamble),
followed by one ``{"role": "tool", "tool_call_id", "content"}`` reply per call, then the assistant's answer.

What varies (each conversation depends only on (seed, its index), so a prefix of a larger file is the
smaller file):
  * 1-8 user/assistant turns, weighted towards few (mean 3.3);
  * user messages 20 words median, assistant 60, tool replies 40, lognormal (sigma 1.1) clipped to
    3-1,000 words: a few words to about 1,500 tokens with the benchmark's 32k BPE (~1.5 tokens a
    word), with a long tail;
  * ~30 % with a system prompt (10-300 words);
  * ~20 % with tools: 1-5 functions from a fixed pool of 48, one to three assistant turns that call
    1-3 of them (arguments drawn from each schema), tool replies as JSON objects or plain text, and
    sometimes a second round of calls before the answer;
  * text: Zipf-distributed words of bench/corpus.py's word list (accented and non-Latin words among
    them, ~3 % of words), punctuation, paragraph breaks and bullet lists, and now and then an emoji or
    a short non-Latin phrase.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import orjson

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from corpus import word_list  # noqa: E402

TURN_WEIGHTS = np.array([0.25, 0.2, 0.15, 0.12, 0.1, 0.08, 0.06, 0.04])  # 1..8 user/assistant turns
SYSTEM_SHARE, TOOLS_SHARE = 0.30, 0.20
USER_MEDIAN_WORDS, ASSISTANT_MEDIAN_WORDS, SIGMA = 20, 60, 1.1
MIN_WORDS, MAX_WORDS = 3, 1000  # ~1,500 tokens at the benchmark tokenizer's ~1.5 tokens a word
# (separator, weight, ends a sentence); the last ones make paragraphs and bullet lists
SEPARATORS = [(" ", 800, False), (", ", 70, False), (". ", 50, True), ("? ", 4, True), ("! ", 3, True),
              ("; ", 5, False), (": ", 5, False), (" - ", 4, False), (".\n\n", 10, True), (":\n- ", 2, True),
              ("\n- ", 3, True)]
EXTRAS = ["😀", "👍", "🚀", "→", "✓", "東京で会いましょう", "спасибо большое", "καλημέρα", "¿qué tal?", "naïve café",
          "数据集", "€20", "Zürich", "深度学习"]
N_TOOLS = 48
SYSTEM_OPENERS = ["You are a helpful assistant.", "You are a careful research assistant.",
                  "You answer briefly and precisely.", "Du bist ein hilfreicher Assistent.",
                  "Tu es un assistant serviable.", "あなたは親切なアシスタントです。"]


class Words:
    """The corpus word list with its Zipf weights; draws text from a numpy Generator."""

    def __init__(self, seed: int = 12345):
        words = word_list(seed)
        self.plain = np.array(words, dtype=object)
        self.caps = np.array([w[:1].upper() + w[1:] for w in words], dtype=object)
        ranks = np.arange(1, len(words) + 1, dtype=np.float64)
        w = 1.0 / (ranks + 2.7) ** 1.07
        self.cdf = np.cumsum(w / w.sum())
        self.seps = np.array([s for s, _, _ in SEPARATORS], dtype=object)
        sw = np.array([x for _, x, _ in SEPARATORS], dtype=np.float64)
        self.sep_cdf = np.cumsum(sw / sw.sum())
        self.sep_ends = np.array([e for _, _, e in SEPARATORS])
        # plain ASCII words (letters only) for identifiers: function and parameter names
        self.idents = [x for x in words[:6000] if x.isascii() and x.isalpha() and len(x) >= 3]

    def text(self, rng: np.random.Generator, n: int) -> str:
        """About `n` words of prose: capitalised sentence starts, punctuation, a full stop at the end."""
        n = max(1, int(n))
        idx = np.minimum(np.searchsorted(self.cdf, rng.random(n)), len(self.cdf) - 1)
        sep = np.minimum(np.searchsorted(self.sep_cdf, rng.random(n)), len(self.sep_cdf) - 1)
        cap = np.zeros(n, dtype=bool)
        cap[0] = True
        cap[1:] = self.sep_ends[sep[:-1]]
        out = np.empty(2 * n, dtype=object)
        out[0::2] = np.where(cap, self.caps[idx], self.plain[idx])
        out[1::2] = self.seps[sep]
        out[-1] = "."
        if n > 20 and rng.random() < 0.15:  # now and then an emoji or a non-Latin phrase
            out[2 * int(rng.integers(1, n - 1)) + 1] = " " + EXTRAS[int(rng.integers(len(EXTRAS)))] + " "
        return "".join(out.tolist())

    def ident(self, rng: np.random.Generator, parts: int = 2) -> str:
        return "_".join(self.idents[int(rng.integers(len(self.idents)))] for _ in range(parts))


def lognormal_words(rng: np.random.Generator, median: float) -> int:
    return int(np.clip(rng.lognormal(np.log(median), SIGMA), MIN_WORDS, MAX_WORDS))


def tool_pool(words: Words, seed: int) -> list[dict]:
    """N_TOOLS JSON-schema functions with 1-5 parameters of every JSON type."""
    rng = np.random.default_rng([seed, 1 << 30])
    tools, names = [], set()
    while len(tools) < N_TOOLS:
        name = words.ident(rng, 2)
        if name in names:
            continue
        names.add(name)
        props, required = {}, []
        for _ in range(int(rng.integers(1, 6))):
            p = words.ident(rng, 1)
            kind = ["string", "integer", "number", "boolean", "enum", "array"][int(rng.integers(6))]
            desc = words.text(rng, int(rng.integers(3, 12)))
            if kind == "enum":
                props[p] = {"type": "string", "enum": [words.ident(rng, 1) for _ in range(int(rng.integers(2, 5)))],
                            "description": desc}
            elif kind == "array":
                props[p] = {"type": "array", "items": {"type": "string"}, "description": desc}
            else:
                props[p] = {"type": kind, "description": desc}
            if rng.random() < 0.6:
                required.append(p)
        tools.append({"type": "function", "function": {
            "name": name, "description": words.text(rng, int(rng.integers(5, 25))),
            "parameters": {"type": "object", "properties": props, "required": required}}})
    return tools


def arguments(words: Words, rng: np.random.Generator, tool: dict) -> dict:
    """Arguments for one call: every required parameter, each optional one half the time."""
    params = tool["function"]["parameters"]
    args = {}
    for p, spec in params["properties"].items():
        if p not in params["required"] and rng.random() < 0.5:
            continue
        if "enum" in spec:
            args[p] = spec["enum"][int(rng.integers(len(spec["enum"])))]
        elif spec["type"] == "string":
            args[p] = words.text(rng, int(rng.integers(1, 7)))[:-1]
        elif spec["type"] == "integer":
            args[p] = int(rng.integers(-10, 100_000))
        elif spec["type"] == "number":
            args[p] = round(float(rng.normal(0, 1000)), 2)
        elif spec["type"] == "boolean":
            args[p] = bool(rng.random() < 0.5)
        else:
            args[p] = [words.text(rng, int(rng.integers(1, 3)))[:-1] for _ in range(int(rng.integers(1, 4)))]
    return args


def tool_reply(words: Words, rng: np.random.Generator) -> str:
    """A tool's answer: a JSON object (60 %) or plain text, a few words to a few hundred."""
    n = lognormal_words(rng, 40)
    if rng.random() < 0.6:
        items = [{"id": int(rng.integers(1 << 20)), "title": words.text(rng, int(rng.integers(2, 8)))[:-1],
                  "score": round(float(rng.random()), 3)} for _ in range(int(rng.integers(0, 4)))]
        body = {"status": "ok", "results": items, "summary": words.text(rng, n)}
        return orjson.dumps(body).decode()
    return words.text(rng, n)


def conversation(words: Words, pool: list[dict], seed: int, index: int) -> dict:
    """Conversation `index`: depends only on (seed, index)."""
    rng = np.random.default_rng([seed, index])
    turns = 1 + int(rng.choice(len(TURN_WEIGHTS), p=TURN_WEIGHTS))
    messages: list[dict] = []
    if rng.random() < SYSTEM_SHARE:
        opener = SYSTEM_OPENERS[int(rng.integers(len(SYSTEM_OPENERS)))]
        messages.append({"role": "system", "content": opener + " " + words.text(rng, lognormal_words(rng, 40) // 2 + 8)})
    record: dict = {}
    tools: list[dict] = []
    calling_turns: set[int] = set()
    if rng.random() < TOOLS_SHARE:
        picks = rng.choice(len(pool), size=int(rng.integers(1, 6)), replace=False)
        tools = [pool[int(i)] for i in picks]
        calling_turns = {int(t) for t in rng.choice(turns, size=min(turns, int(rng.integers(1, 4))), replace=False)}
    n_calls = 0
    for t in range(turns):
        messages.append({"role": "user", "content": words.text(rng, lognormal_words(rng, USER_MEDIAN_WORDS))})
        if t in calling_turns:
            for _ in range(1 + (rng.random() < 0.2)):  # sometimes a second round of calls
                calls = []
                for _ in range(int(rng.integers(1, 4))):
                    tool = tools[int(rng.integers(len(tools)))]
                    calls.append({"id": f"call_{index}_{n_calls}", "type": "function",
                                  "function": {"name": tool["function"]["name"],
                                               "arguments": arguments(words, rng, tool)}})
                    n_calls += 1
                pre = words.text(rng, int(rng.integers(3, 15))) if rng.random() < 0.3 else None
                messages.append({"role": "assistant", "content": pre, "tool_calls": calls})
                for c in calls:
                    messages.append({"role": "tool", "tool_call_id": c["id"], "content": tool_reply(words, rng)})
        messages.append({"role": "assistant", "content": words.text(rng, lognormal_words(rng, ASSISTANT_MEDIAN_WORDS))})
    record["messages"] = messages
    if tools:
        record["tools"] = tools
    return record


def conversations(n: int, seed: int = 0, start: int = 0) -> Iterator[dict]:
    """Conversations start .. start + n - 1 of the seed's stream."""
    words = Words()
    pool = tool_pool(words, seed)
    for i in range(start, start + n):
        yield conversation(words, pool, seed, i)


def write_conversations(path: str | Path, n: int, seed: int = 0) -> int:
    """Write `n` conversations as JSONL (UTF-8, non-ASCII kept as is); return bytes written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    size = 0
    with open(tmp, "wb") as f:
        for rec in conversations(n, seed):
            line = orjson.dumps(rec) + b"\n"
            f.write(line)
            size += len(line)
    tmp.rename(path)
    return size


def texts(record: dict) -> Iterator[str]:
    """Every string a record holds (contents, tool arguments and schemas as JSON): tokenizer training text."""
    for m in record["messages"]:
        if m.get("content"):
            yield m["content"]
        for c in m.get("tool_calls") or ():
            yield orjson.dumps(c["function"]).decode()
    for t in record.get("tools") or ():
        yield orjson.dumps(t).decode()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--conversations", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    size = write_conversations(args.output, args.conversations, args.seed)
    print(f"wrote {args.conversations:,} conversations, {size / 1e6:.1f} MB, to {args.output} in "
          f"{time.perf_counter() - t0:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
