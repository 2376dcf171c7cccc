"""The tokenizer class a folder names: shardsmith encodes with what ``AutoTokenizer.from_pretrained``
builds in transformers 5 (a legacy SentencePiece tokenizer.json named LlamaTokenizer gets a
Metaspace pre-tokenizer, not the file's normalizer), or refuses the class in one line."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
from chat_models import (
    MISTRAL,
    MISTRAL_GENERATION,
    Model,
    random_conversation,
    random_text,
    sentencepiece_folder,
    sentencepiece_json,
    tokenizer_json,
)
from conftest import run_cli, write_jsonl

import shardsmith
from shardsmith.text import hf_tables
from shardsmith.text.chat import ChatFields, conversation_of, rendered
from shardsmith.text.tokenizer_class import RECIPES, built
from shardsmith.text.tokenizer_folder import TokenizerFolder

transformers = pytest.importorskip("transformers")
N = 80


@pytest.fixture(scope="module")
def spm() -> str:
    return sentencepiece_json()


def _config(folder: Path, **changes) -> Path:
    path = folder / "tokenizer_config.json"
    config = {**json.loads(path.read_text()), **changes}
    path.write_text(json.dumps({k: v for k, v in config.items() if v is not None}))
    return folder


def _ours(folder: Path) -> dict:
    return json.loads(built(TokenizerFolder.read(folder / "tokenizer.json"),
                            (folder / "tokenizer.json").read_bytes()).data)


def _theirs(folder: Path) -> dict:
    return json.loads(transformers.AutoTokenizer.from_pretrained(folder).backend_tokenizer.to_str())


def _conversations(path: Path, n: int, seed: int) -> list[dict]:
    """``n`` conversations, written to ``path`` as JSONL rows of {"messages": [...]}."""
    rng = random.Random(seed)
    rows = [{"messages": random_conversation(rng)} for _ in range(n)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return rows


@pytest.mark.parametrize("template", ["generation", "turn by turn"])
def test_a_legacy_sentencepiece_llama_folder_gives_transformers_ids_and_masks(tmp_path, spm, template):
    folder = sentencepiece_folder(tmp_path / "mistral", spm, MISTRAL_GENERATION if template == "generation" else MISTRAL)
    model = Model(folder)
    assert type(model.reference).__name__ == "LlamaTokenizer"
    rows = _conversations(tmp_path / "in" / "c.jsonl", N, seed=3)
    res = run_cli("pack-tokens", tmp_path / "in", "-o", tmp_path / "out", "--tokenizer", folder / "tokenizer.json",
                  "--chat", "--no-shuffle", "-q")
    assert res.exit_code == 0, res.stderr
    docs = shardsmith.open(tmp_path / "out")
    assert len(docs) == N
    for i, row in enumerate(rows):
        want = model.reference.apply_chat_template(row["messages"], tokenize=True, return_dict=True,
                                                   return_assistant_tokens_mask=True)
        if template == "generation":
            mask = [bool(b) for b in want["assistant_masks"]]
        else:  # the turn-by-turn spans over transformers' own offsets
            text, spans = rendered(model.template, conversation_of(row, ChatFields()), train_on="assistant")
            offsets = model.reference(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
            mask = [any(e > a and s < b for a, b in spans) for s, e in offsets]
        assert docs[i]["tokens"].tolist() == want["input_ids"], i
        assert docs[i]["loss_mask"].tolist() == mask, i
    m = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert m["tokenizer"]["built_as"] == "LlamaTokenizer"
    # the dataset's tokenizer.json is the one the ids came from: transformers loads it as it is
    again = transformers.AutoTokenizer.from_pretrained(tmp_path / "out")
    assert type(again).__name__ == "TokenizersBackend"
    for i in (0, 5, 77):
        assert again.apply_chat_template(rows[i]["messages"], tokenize=True, return_dict=True)["input_ids"] == \
            docs[i]["tokens"].tolist()
    assert run_cli("verify", tmp_path / "out").exit_code == 0


def test_plain_text_with_such_a_folder_is_transformers_ids_too(tmp_path, spm):
    folder = sentencepiece_folder(tmp_path / "llama2", spm, None)
    rng = random.Random(5)
    texts = [" ".join(random_text(rng) for _ in range(4)) + rng.choice(["", " [INST] x [/INST]", "</s> y", "<s>"])
             for _ in range(80)]
    write_jsonl(tmp_path / "in" / "t.jsonl", texts)
    res = run_cli("pack-tokens", tmp_path / "in", "-o", tmp_path / "out", "--tokenizer", folder / "tokenizer.json",
                  "--no-shuffle", "-q", "--engine", "hf")
    assert res.exit_code == 0, res.stderr
    ref = transformers.AutoTokenizer.from_pretrained(folder)
    docs = shardsmith.open(tmp_path / "out")
    eos = ref.convert_tokens_to_ids("</s>")
    for i, text in enumerate(texts):
        assert docs[i].tolist() == ref(text, add_special_tokens=False)["input_ids"] + [eos], i


@pytest.mark.parametrize("case", ["llama", "llama legacy", "llama no prefix", "qwen2", "qwen3_5",
                                  "gpt2", "gemma", "added tokens' flags", "special tokens of the config"])
def test_what_shardsmith_builds_is_what_transformers_builds(tmp_path, spm, case):
    """The whole tokenizer.json, compared: normalizer, pre-tokenizer, model options, added tokens."""
    folder = sentencepiece_folder(tmp_path / "f", spm, MISTRAL)
    changes = {"llama legacy": {"legacy": True}, "llama no prefix": {"add_prefix_space": False},
               "qwen2": {"tokenizer_class": "Qwen2TokenizerFast"}, "qwen3_5": {"tokenizer_class": "Qwen3_5Tokenizer"},
               "gpt2": {"tokenizer_class": "GPT2Tokenizer"}, "gemma": {"tokenizer_class": "GemmaTokenizer"},
               "added tokens' flags": {"tokenizer_class": "PreTrainedTokenizerFast", "added_tokens_decoder": {
                   "1": {"content": "<s>", "lstrip": True, "rstrip": True, "normalized": False, "single_word": False,
                         "special": True}}},
               "special tokens of the config": {"tokenizer_class": "PreTrainedTokenizerFast", "pad_token": "<pad>",
                                                "image_token": "<image>", "extra_special_tokens": ["<x>"]},
               }.get(case, {})
    _config(folder, **changes)
    assert _ours(folder) == _theirs(folder)


@pytest.mark.parametrize(("tokenizer_class", "model_type", "rebuilt"), [
    ("LlamaTokenizer", "llama", True),  # Llama-2's snapshot: rebuilt
    ("LlamaTokenizer", "mistral", False),  # Mistral's snapshot: config.json's model type keeps the file
    ("PreTrainedTokenizerFast", "qwen2", True),  # the registered Qwen2Tokenizer overrules the Hub's class
    ("LlamaTokenizerFast", None, True),
])
def test_a_models_config_json_decides_with_the_tokenizer_class(tmp_path, spm, tokenizer_class, model_type, rebuilt):
    folder = sentencepiece_folder(tmp_path / "f", spm, MISTRAL, tokenizer_class=tokenizer_class)
    if model_type:
        (folder / "config.json").write_text(json.dumps({"model_type": model_type}))
    ours = built(TokenizerFolder.read(folder / "tokenizer.json"), (folder / "tokenizer.json").read_bytes())
    assert (ours.data != (folder / "tokenizer.json").read_bytes()) == rebuilt
    assert json.loads(ours.data) == _theirs(folder)


def test_a_byte_level_file_named_llama_tokenizer_is_kept_as_it_is(tmp_path):
    """Llama-3's tokenizer.json (byte-level) under LlamaTokenizer: transformers keeps it, so do we."""
    folder = tmp_path / "llama3"
    folder.mkdir()
    raw = tokenizer_json(kind="llama3", trim_offsets=False).encode()
    (folder / "tokenizer.json").write_bytes(raw)
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "LlamaTokenizerFast"}))
    ours = built(TokenizerFolder.read(folder / "tokenizer.json"), raw)
    assert ours.built_as is None and ours.data == raw
    assert json.loads(raw) == _theirs(folder)


@pytest.mark.parametrize(("changes", "words"), [
    ({"tokenizer_class": "T5Tokenizer"}, "tokenizer_class 'T5Tokenizer'"),
    ({"tokenizer_class": "CodeLlamaTokenizer"}, "tokenizer_class 'CodeLlamaTokenizer'"),
    ({"tokenizer_class": "MyOwnTokenizer"}, "tokenizer_class 'MyOwnTokenizer'"),
    ({"auto_map": {"AutoTokenizer": ["x.MyTok", None]}}, "\"auto_map\" names a tokenizer in the model's own code"),
    ({"split_special_tokens": True}, "\"split_special_tokens\""),
])
def test_a_class_shardsmith_does_not_build_is_one_line(tmp_path, spm, changes, words):
    folder = _config(sentencepiece_folder(tmp_path / "f", spm, MISTRAL), **changes)
    _conversations(tmp_path / "in" / "c.jsonl", 3, seed=1)
    for chat in ((), ("--chat",)):
        res = run_cli("pack-tokens", tmp_path / "in", "-o", tmp_path / "out", "--tokenizer", folder / "tokenizer.json",
                      "-q", *chat)
        assert res.exit_code == 2, res.stderr
        assert words in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_the_tables_are_transformers_own():
    """text/hf_tables.py against the installed transformers: a release that changes them fails here."""
    from transformers.models.auto import tokenization_auto as auto
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    registered: dict[str, str] = {}
    for model_type, name in auto.TOKENIZER_MAPPING_NAMES.items():
        if name:
            registered[name] = " ".join(sorted([*registered.get(name, "").split(), model_type]))
    assert registered == hf_tables.MODEL_TYPES
    assert frozenset(auto.MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS) == hf_tables.INCORRECT_HUB_CLASS

    def cls_of(name: str) -> type:
        found = auto.tokenizer_class_from_name(name) or auto.tokenizer_class_from_name(name + "Fast")
        return TokenizersBackend if found is None or found.__name__ == "PythonBackend" else found

    for name in hf_tables.AS_IS:  # each loads tokenizer.json as it is
        found = cls_of(name)
        assert found is TokenizersBackend or "__init__" not in found.__dict__, name
    for name in RECIPES:  # each builds its own pipeline (what RECIPES reproduces)
        found = cls_of(name)
        assert found.__name__ == name and issubclass(found, TokenizersBackend) and "__init__" in found.__dict__, name


def test_the_folder_files_are_part_of_the_run(tmp_path, spm):
    """A changed tokenizer_config.json (another class) is another run: the folder is not reused as finished."""
    folder = sentencepiece_folder(tmp_path / "f", spm, MISTRAL)
    write_jsonl(tmp_path / "in" / "t.jsonl", ["hello [INST] world"] * 3)
    args = ("pack-tokens", tmp_path / "in", "-o", tmp_path / "out", "--tokenizer", folder / "tokenizer.json", "-q")
    assert run_cli(*args).exit_code == 0
    first = (tmp_path / "out" / "tokenizer.json").read_bytes()
    _config(folder, tokenizer_class="PreTrainedTokenizerFast")
    res = run_cli(*args)
    assert res.exit_code == 2 and "made from other inputs" in res.stderr, res.stderr
    shutil.rmtree(tmp_path / "out")
    assert run_cli(*args).exit_code == 0
    assert (tmp_path / "out" / "tokenizer.json").read_bytes() == (folder / "tokenizer.json").read_bytes() != first
