"""The small files the next tools read beside the shards, so none needs a step by hand.

- ``tokenizer_config.json`` and ``special_tokens_map.json`` beside ``tokenizer.json``: transformers'
  ``AutoTokenizer.from_pretrained(out)`` then knows eos, bos and pad, and so does megatron-core's
  ``HuggingFaceTokenizer`` (``--tokenizer-type HuggingFaceTokenizer --tokenizer-model OUT``), whose
  ``eod`` is the eos token (without these files both see no eos at all).
- ``meta.pkl`` with ``--nanogpt``: ``{"vocab_size": V}``, which nanoGPT's ``train.py`` reads to size
  the embedding (without it, 50304, GPT-2's). Written, never read: shardsmith opens no pickle.

Every file is a pure function of the tokenizer and the options (no time, no paths), so a rerun
writes the same bytes; the manifest lists them (``companions``) and ``verify`` checks their sha256.

What they hold: ``tokenizer_config.json`` has ``tokenizer_class`` ``PreTrainedTokenizerFast``,
``clean_up_tokenization_spaces`` false and ``bos_token``/``eos_token``/``pad_token``;
``special_tokens_map.json`` those that are set. eos is the token appended (none with ``--no-eos``),
bos ``--bos-token``, pad the one packed sequences are padded with, else a ``<pad>``, ``[PAD]``,
``<|pad|>`` or ``<|padding|>`` among the special tokens, else none. ``meta.pkl`` is
``pickle.dumps({"vocab_size": V}, protocol=4)``. nanoGPT's ``sample.py`` expects a character-level
``meta.pkl`` (``stoi``/``itos``) and fails on ours: decode with ``tokenizer.json``.
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TOKENIZER = "tokenizer.json"  # the tokenizer the ids come from, beside the shards (the manifest's ``tokenizer``)
HF_FILES = ("tokenizer_config.json", "special_tokens_map.json")
NANOGPT_META = "meta.pkl"
NANOGPT_SUFFIX = ".bin"  # nanoGPT's flat token file of a split: ``{split}.bin``


def nanogpt_name(split: str) -> str:
    return f"{split}{NANOGPT_SUFFIX}"

PICKLE_PROTOCOL = 4  # readable by every Python nanoGPT runs on (3.4+)
PAD_CANDIDATES = ("<pad>", "[PAD]", "<|pad|>", "<|padding|>")


@dataclass(frozen=True, kw_only=True)
class SpecialTokens:
    """The special tokens a run used: eos appended, bos prepended, pad of packed sequences or the tokenizer's."""

    eos: str | None
    bos: str | None
    pad: str | None

    def as_map(self) -> dict[str, str]:
        return {f"{key}_token": value for key, value in (("bos", self.bos), ("eos", self.eos), ("pad", self.pad))
                if value is not None}


def found_pad(hf: Any, pad_id: int | None) -> str | None:
    """The padding token: the one packed sequences are padded with, else a usual pad token among the
    tokenizer's specials, else none (a run that does not pad names no pad it did not find)."""
    if pad_id is not None:
        return hf.id_to_token(pad_id)
    specials = {t.content for t in hf.get_added_tokens_decoder().values() if t.special}
    return next((c for c in PAD_CANDIDATES if c in specials), None)


def hf_files(tokens: SpecialTokens, *, chat_template: Any = None, extra: dict[str, Any] | None = None
             ) -> dict[str, bytes]:
    """``tokenizer_config.json`` and ``special_tokens_map.json`` for the ``tokenizer.json`` beside them;
    ``chat_template`` (``--chat``: a string or transformers' named list) and ``extra`` (the other
    special tokens the template was rendered with) go into the config, so that
    ``AutoTokenizer.from_pretrained(out)`` renders conversations as the run did."""
    config = {
        **(extra or {}),
        "tokenizer_class": "PreTrainedTokenizerFast",  # tokenizer.json as it is, in transformers 4 and 5
        "clean_up_tokenization_spaces": False,  # decode as tokenizers does (no space removed before ".")
        "bos_token": tokens.bos, "eos_token": tokens.eos, "pad_token": tokens.pad,
    }
    if chat_template is not None:
        config["chat_template"] = chat_template
    return {"tokenizer_config.json": _json(config), "special_tokens_map.json": _json(tokens.as_map())}


def nanogpt_meta(vocab_size: int) -> bytes:
    """nanoGPT's ``meta.pkl``: a plain dict of ints (``train.py`` reads ``meta["vocab_size"]``)."""
    return pickle.dumps({"vocab_size": int(vocab_size)}, protocol=PICKLE_PROTOCOL)


def write_companions(home: Path, files: dict[str, bytes], *, write: Callable[[Path, bytes], None]) -> list[str]:
    """Write the files into the dataset folder (``write`` leaves a file that already holds the bytes
    alone); returns their names for the manifest's ``companions``."""
    for name, data in files.items():
        write(home / name, data)
    return list(files)


def _json(obj: dict[str, Any]) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()
