"""Make the chat example's files (already in the repository; rerun to see how they were made):
``conversations.jsonl`` (300 short multi-turn conversations, OpenAI style, some with a system
prompt) and ``tokenizer/`` (a byte-level BPE of 2,000 tokens trained on them, with ChatML's special
tokens, and ``tokenizer_config.json`` holding a ChatML chat template whose ``{% generation %}``
blocks mark the assistant's tokens).

    python examples/chat/make_example.py
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORDS = ["the", "a", "model", "data", "shard", "token", "batch", "loss", "train", "step", "learn", "fast", "slow", "memory", "disk", "read", "write", "pack", "sequence", "document", "answer", "question", "please", "thanks", "why", "how", "what", "when", "result", "value", "number", "small", "large", "first", "last", "next", "every", "each", "shuffle", "exact", "seed", "order", "worker", "rank", "epoch", "resume", "checkpoint"]
TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['role'] == 'assistant' %}"
    "{%- generation %}{{- message['content'] + '<|im_end|>' }}{%- endgeneration %}"
    "{%- else %}{{- message['content'] + '<|im_end|>' }}{%- endif %}"
    "{{- '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def sentence(rng: random.Random, low: int, high: int) -> str:
    text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))
    return text[0].upper() + text[1:] + rng.choice([".", "?", "!"])


def conversations(n: int = 300, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        messages = [{"role": "system", "content": sentence(rng, 4, 12)}] if rng.random() < 0.3 else []
        for _ in range(rng.randint(1, 4)):
            messages.append({"role": "user", "content": sentence(rng, 3, 30)})
            messages.append({"role": "assistant", "content": " ".join(sentence(rng, 5, 40)
                                                                      for _ in range(rng.randint(1, 4)))})
        rows.append({"messages": messages})
    return rows


def main() -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    rows = conversations()
    (HERE / "conversations.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=2000, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator((m["content"] for r in rows for m in r["messages"]), trainer=trainer)
    folder = HERE / "tokenizer"
    folder.mkdir(exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
              "chat_template": TEMPLATE}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {HERE / 'conversations.jsonl'} ({len(rows)} conversations) and {folder}")


if __name__ == "__main__":
    main()
