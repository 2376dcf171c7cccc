"""Model folders for the chat tests (test_chat_kit.py, test_chat_pack.py): chat templates written
out as models ship them (ChatML, Llama-3 with {% generation %} blocks, Qwen2.5 with a system prompt
and tools), byte-level BPE tokenizers trained here, the folders transformers loads, and generated
conversations with transformers' own answer for them."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from shardsmith.text.chat_files import load_chat_template
from shardsmith.text.chat_tokens import ChatEncoder

transformers = pytest.importorskip("transformers")

# ---------------------------------------------------------------------------------------------
# templates, written out as the models ship them (shortened only where nothing is exercised)

CHATML = (
    "{%- for message in messages %}"
    "{%- if loop.first and message.role != 'system' %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

LLAMA3_GENERATION = """{{- bos_token }}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] | trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}
{{- 'Cutting Knowledge Date: December 2023\\n\\n' }}
{{- system_message + '<|eot_id|>' }}
{%- for message in messages %}
    {%- if message['role'] not in ['user', 'assistant'] %}
        {{- raise_exception('Conversation roles must be user or assistant') }}
    {%- endif %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}
    {%- if message['role'] == 'assistant' %}
        {%- generation %}{{- message['content'] | trim + '<|eot_id|>' }}{%- endgeneration %}
    {%- else %}
        {{- message['content'] | trim + '<|eot_id|>' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

_QWEN_SYSTEM = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n" }}
    {{- "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
"""
_QWEN_TOOL_REPLY = """    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""
_QWEN_CALLS = """        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
"""
# Qwen2.5's template (Hermes-style tools): no generation blocks, read turn by turn
QWEN_TOOLS = _QWEN_SYSTEM + """{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
""" + _QWEN_CALLS + """        {{- '<|im_end|>\\n' }}
""" + _QWEN_TOOL_REPLY
# the same with generation blocks around what the assistant writes (as TRL's training templates do)
QWEN_TOOLS_GENERATION = _QWEN_SYSTEM + """{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>assistant\\n' }}
        {%- generation %}
        {{- message.content if message.content is defined else '' }}
""" + _QWEN_CALLS + """        {{- '<|im_end|>' }}
        {%- endgeneration %}
        {{- '\\n' }}
""" + _QWEN_TOOL_REPLY
# a bare template whose generation blocks can be empty and sit inside a pre-token (" \n")
PLAIN_GENERATION = ("{%- for m in messages %}{{ m.role }}: {% if m.role == 'assistant' %}{% generation %}"
                    "{{ m.content }}{% endgeneration %}{% else %}{{ m.content }}{% endif %}\n{% endfor %}")

# ---------------------------------------------------------------------------------------------
# tokenizers: byte-level BPE trained here, saved as a model folder transformers loads

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|start_header_id|>",
            "<|end_header_id|>", "<|eot_id|>"]
PIECES = ["hello", " world", "the", " quick", "Brown", "fox's", "日本語", " 東京", "🤖", "🙂", "naïve", "café",
          "e\u0301", "\u00a0", "\u3000", "\u2028", " ", "  ", "   ", "\n", "\n\n", " \n", "\t", "x", "1234", "?!", "..",
          "<|im_end|>", "<|im_start|>", "<|eot_id|>", "<tool_call>", "</tool_call>", "Ġ", "assistant", "user", ""]
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def random_text(rng: random.Random) -> str:
    return "".join(rng.choice(PIECES) for _ in range(rng.choice([0, 0, 1, 2, 4, 9, 25])))


def _corpus() -> list[str]:
    rng = random.Random(7)
    return [" ".join(random_text(rng) for _ in range(8)) + rng.choice(["", " \n", ": \n", "\n\n"]) for _ in range(400)]


def tokenizer_json(*, kind: str, trim_offsets: bool = True, add_prefix_space: bool = False,
                    nfc: bool = False) -> str:
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )

    tok = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space, use_regex=kind == "gpt2")
    if kind == "gpt2":
        tok.pre_tokenizer = byte_level
    else:  # Llama-3's and Qwen2's: a split regex, then bytes
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"), byte_level])
    if kind == "qwen" or nfc:
        tok.normalizer = normalizers.NFC()
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=900, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_corpus(), trainer=trainer)
    tok.add_tokens([AddedToken("<tool_call>", special=False, normalized=False),
                    AddedToken("</tool_call>", special=False, normalized=False)])
    if kind == "gpt2":  # RoBERTa's: takes the spaces before it (bytes no token stands for)
        tok.add_special_tokens([AddedToken("<mask>", lstrip=True, special=True)])
    trim = processors.ByteLevel(trim_offsets=trim_offsets, add_prefix_space=add_prefix_space)
    if kind == "llama3":
        tok.post_processor = processors.Sequence([trim, processors.TemplateProcessing(
            single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", tok.token_to_id("<|begin_of_text|>"))])])
    else:
        tok.post_processor = trim
    return tok.to_str()


# Mistral's template (v0.1), and the same with generation blocks around what the assistant writes
MISTRAL = ("{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
           "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
           "{{ message['content'] + eos_token }}{% endif %}{% endfor %}")
MISTRAL_GENERATION = MISTRAL.replace("{{ message['content'] + eos_token }}",
                                     "{% generation %}{{ message['content'] + eos_token }}{% endgeneration %}")


def sentencepiece_json(*, unigram: bool = False) -> str:
    """A legacy SentencePiece tokenizer.json as Llama-2 and Mistral ship it: a Prepend("▁") and
    Replace(" ", "▁") normalizer, no pre-tokenizer, byte fallback over <0x00>..<0xFF>, <unk> <s> </s>
    first, and [INST] [/INST] as added special tokens (Mistral's control tokens)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, trainers

    specials = ["<unk>", "<s>", "</s>"]
    if unigram:
        tok = Tokenizer(models.Unigram())
        trainer = trainers.UnigramTrainer(vocab_size=400, special_tokens=specials, unk_token="<unk>",
                                          show_progress=False)
    else:
        tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
        trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=specials, show_progress=False)
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.train_from_iterator(_corpus(), trainer=trainer)
    spec = json.loads(tok.to_str())
    if unigram:
        ids = {piece: i for i, (piece, _) in enumerate(spec["model"]["vocab"])}
    else:  # Llama-2's order: the specials, the 256 byte tokens, then the pieces
        trained = sorted(spec["model"]["vocab"].items(), key=lambda kv: kv[1])
        ids = {t: i for i, t in enumerate(specials + [f"<0x{b:02X}>" for b in range(256)])}
        for piece, _ in trained:
            ids.setdefault(piece, len(ids))
        spec["model"]["vocab"] = ids
    spec["added_tokens"] = [{"id": ids[t], "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                             "normalized": False, "special": True} for t in specials]
    bos = {"SpecialToken": {"id": "<s>", "type_id": 0}}
    spec["post_processor"] = {"type": "TemplateProcessing", "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
                              "pair": [bos, {"Sequence": {"id": "A", "type_id": 0}}, bos,
                                       {"Sequence": {"id": "B", "type_id": 1}}],
                              "special_tokens": {"<s>": {"id": "<s>", "ids": [ids["<s>"]], "tokens": ["<s>"]}}}
    tok = Tokenizer.from_str(json.dumps(spec))
    tok.add_special_tokens([AddedToken("[INST]", normalized=False, special=True),
                            AddedToken("[/INST]", normalized=False, special=True)])
    return tok.to_str()


def sentencepiece_folder(root: Path, json_text: str, template, *, tokenizer_class: str = "LlamaTokenizer",
                         **config) -> Path:
    """A Llama-2/Mistral tokenizer folder: tokenizer_config.json names ``tokenizer_class`` and lists
    the file's added tokens, as save_pretrained writes them."""
    spec = json.loads(json_text)
    decoder = {str(t["id"]): {k: v for k, v in t.items() if k != "id"} for t in spec["added_tokens"]}
    return model_folder(root, json_text, template, tokenizer_class=tokenizer_class, bos_token="<s>", eos_token="</s>",
                        unk_token="<unk>", added_tokens_decoder=decoder, legacy=False, **config)


def model_folder(root: Path, json_text: str, template, **config) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "tokenizer.json").write_text(json_text, encoding="utf-8")
    config = {"tokenizer_class": "PreTrainedTokenizerFast", **config}
    if template is not None:
        config["chat_template"] = template
    (root / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return root


class Model:
    """A model folder: its tokenizer.json, transformers' tokenizer of it, our template and encoders."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.json = (folder / "tokenizer.json").read_text(encoding="utf-8")
        self.reference = transformers.AutoTokenizer.from_pretrained(folder)
        self.template = load_chat_template(tokenizer=folder / "tokenizer.json", template_file=None)
        self.encoders = {e: ChatEncoder(tokenizer_json=self.json, engine=e) for e in ("hf", "gigatoken")}



def build_tokenizers() -> dict[str, str]:
    return {"gpt2": tokenizer_json(kind="gpt2", trim_offsets=True),
            "llama3": tokenizer_json(kind="llama3", trim_offsets=False),
            "qwen": tokenizer_json(kind="qwen", trim_offsets=False)}


def build_models(root: Path, tokenizers_json: dict[str, str]) -> dict[str, Model]:
    """Model folders (tokenizer.json, tokenizer_config.json with its template) under root."""
    special = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    return {
        "chatml": Model(model_folder(root / "chatml", tokenizers_json["gpt2"], CHATML, **special)),
        "llama3": Model(model_folder(root / "llama3", tokenizers_json["llama3"], LLAMA3_GENERATION,
                                bos_token={"__type": "AddedToken", "content": "<|begin_of_text|>", "lstrip": False,
                                           "normalized": False, "rstrip": False, "single_word": False,
                                           "special": True}, eos_token="<|eot_id|>")),
        "qwen": Model(model_folder(root / "qwen", tokenizers_json["qwen"], QWEN_TOOLS, **special)),
        "named": Model(model_folder(root / "named", tokenizers_json["qwen"],
                               [{"name": "default", "template": LLAMA3_GENERATION.replace("{{- bos_token }}", "")},
                                {"name": "tool_use", "template": QWEN_TOOLS_GENERATION}], **special)),
        "plain": Model(model_folder(root / "plain", tokenizers_json["llama3"], PLAIN_GENERATION)),
    }


# ---------------------------------------------------------------------------------------------
# generated conversations

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}},
         {"type": "function", "function": {"name": "search", "description": "Search the web <|im_end|>.",
                                            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}]


def random_conversation(rng: random.Random, *, tools: bool = False, roles=("user", "assistant")) -> list[dict]:
    messages = []
    if rng.random() < 0.4:
        messages.append({"role": "system", "content": random_text(rng)})
    for _ in range(rng.randint(1, 4)):
        messages.append({"role": roles[0], "content": random_text(rng)})
        if tools and rng.random() < 0.5:
            calls = [{"type": "function", "function": {"name": rng.choice(["get_weather", "search"]),
                                                       "arguments": {"city": random_text(rng)}}}
                     for _ in range(rng.randint(1, 2))]
            messages.append({"role": "assistant", "content": rng.choice([None, "", random_text(rng)]), "tool_calls": calls})
            messages.extend({"role": "tool", "content": random_text(rng)} for _ in calls)
        if rng.random() < 0.9:
            messages.append({"role": roles[1], "content": random_text(rng)})
    return messages


def transformers_answer(model: Model, messages: list[dict], tools=None) -> tuple[str, dict]:
    ref = model.reference
    text = ref.apply_chat_template(messages, tools=tools, tokenize=False)
    out = ref.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=True,
                                  return_assistant_tokens_mask=True)
    return text, out


