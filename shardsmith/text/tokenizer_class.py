"""The tokenizer ``AutoTokenizer.from_pretrained(folder)`` builds in transformers 5, as a
tokenizer.json: what shardsmith encodes with, so that its ids are transformers' ids.

transformers 5 does not always take tokenizer.json as it is. The class it picks (the
``tokenizer_class`` of tokenizer_config.json; a model's config.json can overrule it) decides:

- ``TokenizersBackend`` (alias ``PreTrainedTokenizerFast``), and the few subclasses without an
  ``__init__`` of their own, load the file as it is;
- a class with its own ``__init__`` keeps only the file's vocabulary, merges and post-processor,
  and builds its own normalizer, pre-tokenizer, decoder and model options. A legacy SentencePiece
  tokenizer.json (Llama-2, Mistral: a ``Prepend("▁")`` normalizer) named ``LlamaTokenizer`` so
  becomes a ``Metaspace`` pre-tokenizer that prepends "▁" only at the start of the text, not
  after every special token as the file's normalizer would.

Either way transformers then adds tokenizer_config.json's added tokens (with their flags: they
replace the file's) and special tokens, and gives a file without a post-processor a plain one.
shardsmith makes the same ``tokenizers`` calls in the same order, for the classes of
``RECIPES``; any other class that builds its own pipeline is refused in one line naming it.
The tables transformers decides with are ``text/hf_tables.py``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from shardsmith.errors import UsageError
from shardsmith.text import hf_tables
from shardsmith.text.chat_template import SPECIAL_TOKEN_NAMES, one_line
from shardsmith.text.tokenizer_folder import TokenizerFolder

_GENERIC = ("TokenizersBackend", "PythonBackend", "PreTrainedTokenizerFast", "MistralCommonBackend")
_METASPACE_DECODER = [{"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"},
                      {"type": "Fuse"}]
_BYTE_LEVEL_DECODER = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
# the split regexes of Qwen2Tokenizer and Qwen3_5Tokenizer (transformers' PRETOKENIZE_REGEX)
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
                r"|\s+(?!\S)|\s+")
_QWEN3_5_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")


@dataclass(frozen=True)
class Recipe:
    """What a class's ``__init__`` builds around the file's vocabulary: the BPE model's options,
    the normalizer, pre-tokenizer and decoder (tokenizer.json's forms), its special tokens'
    defaults, and whether it adds every special token again at the end (Qwen's do)."""

    model: dict[str, Any]
    normalizer: dict[str, Any] | None
    pre_tokenizer: dict[str, Any] | None
    decoder: dict[str, Any] | None
    defaults: dict[str, str | None]
    readds_specials: bool = False


def _bpe(**options: Any) -> dict[str, Any]:
    base = {"dropout": None, "unk_token": None, "continuing_subword_prefix": None, "end_of_word_suffix": None,
            "fuse_unk": False, "byte_fallback": False, "ignore_merges": False}
    return {**base, **options}


def _llama(config: Mapping[str, Any]) -> Recipe:
    prefix = config.get("add_prefix_space")
    prefix = True if prefix is None else prefix
    scheme = ("always" if config.get("legacy", False) else "first") if prefix else "never"
    decoder = _METASPACE_DECODER + ([{"type": "Strip", "content": " ", "start": 1, "stop": 0}] if prefix else [])
    return Recipe(model=_bpe(fuse_unk=True, byte_fallback=True), normalizer=None,
                  pre_tokenizer={"type": "Metaspace", "replacement": "▁", "prepend_scheme": scheme, "split": False},
                  decoder={"type": "Sequence", "decoders": decoder},
                  defaults={"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>"})


def _qwen(split: str) -> Callable[[Mapping[str, Any]], Recipe]:
    def recipe(config: Mapping[str, Any]) -> Recipe:
        prefix = config.get("add_prefix_space")
        prefix = False if prefix is None else prefix
        pre = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": split}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": prefix, "trim_offsets": True, "use_regex": False}]}
        return Recipe(model=_bpe(continuing_subword_prefix="", end_of_word_suffix=""), normalizer={"type": "NFC"},
                      pre_tokenizer=pre, decoder=_BYTE_LEVEL_DECODER,
                      defaults={"unk_token": "<|endoftext|>", "bos_token": None, "eos_token": "<|endoftext|>",
                                "pad_token": "<|endoftext|>"}, readds_specials=True)
    return recipe


def _gpt2(config: Mapping[str, Any]) -> Recipe:
    pre = {"type": "ByteLevel", "add_prefix_space": config.get("add_prefix_space", False), "trim_offsets": True,
           "use_regex": True}
    return Recipe(model=_bpe(continuing_subword_prefix="", end_of_word_suffix=""), normalizer=None, pre_tokenizer=pre,
                  decoder=_BYTE_LEVEL_DECODER,
                  defaults={"unk_token": "<|endoftext|>", "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
                            "pad_token": None})


def _gemma(config: Mapping[str, Any]) -> Recipe:
    unk = _content(config["unk_token"]) if config.get("unk_token") is not None else "<unk>"
    return Recipe(model=_bpe(fuse_unk=True, byte_fallback=True, unk_token=unk),
                  normalizer={"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
                  pre_tokenizer={"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious",
                                 "invert": False},
                  decoder={"type": "Sequence", "decoders": _METASPACE_DECODER},
                  defaults={"unk_token": "<unk>", "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>",
                            "mask_token": "<mask>"})


# the classes with their own __init__ whose pipeline shardsmith builds as transformers 5 does (each
# checked against transformers itself in tests/test_tokenizer_class.py)
RECIPES: dict[str, Callable[[Mapping[str, Any]], Recipe]] = {
    "LlamaTokenizer": _llama, "Qwen2Tokenizer": _qwen(_QWEN2_SPLIT), "Qwen3_5Tokenizer": _qwen(_QWEN3_5_SPLIT),
    "GPT2Tokenizer": _gpt2, "GemmaTokenizer": _gemma,
}


@dataclass(frozen=True)
class Built:
    """``data``: the tokenizer.json to encode with (the file's own bytes when transformers changes
    nothing); ``built_as``: the class whose pipeline replaced the file's (None: the file's)."""

    data: bytes
    built_as: str | None


def _content(value: Any) -> str:
    if isinstance(value, Mapping):
        return str(value.get("content"))
    return str(value)


@cache
def _registered() -> dict[str, str]:
    """model_type → the tokenizer class transformers registers for it."""
    return {mt: cls for cls, types in hf_tables.MODEL_TYPES.items() for mt in types.split()}


def _refused(files: TokenizerFolder, name: str) -> UsageError:
    shown = ", ".join(RECIPES)
    return UsageError(f"--tokenizer: {files.config_path}: tokenizer_class {name!r}: transformers 5 builds this class's "
                      f"own normalizer and pre-tokenizer from tokenizer.json, which shardsmith does not reproduce (it "
                      f"does for {shown}); set \"tokenizer_class\": \"PreTrainedTokenizerFast\" to use tokenizer.json "
                      f"as it is, in transformers too")


def _resolved(files: TokenizerFolder, name: str) -> str | None:
    """The class ``name`` stands for: None for one that takes tokenizer.json as it is, a key of
    ``RECIPES``, else refused."""
    base = name[:-4] if name != "TokenizersBackend" and name.endswith("Fast") else name
    if base in hf_tables.AS_IS:
        return None
    if base in RECIPES:
        return base
    raise _refused(files, name)


def class_of(files: TokenizerFolder, raw: bytes) -> str | None:
    """The class ``AutoTokenizer.from_pretrained(folder)`` picks (transformers 5's order of
    rules, without the Hub): None when it takes tokenizer.json (``raw``) as it is."""
    config, model = files.config, files.model or {}
    if config.get("auto_map") is not None:
        raise UsageError(f"--tokenizer: {files.config_path}: \"auto_map\" names a tokenizer in the model's own "
                         f"code, which shardsmith does not run")
    named = config.get("tokenizer_class")
    hub = named or model.get("tokenizer_class")
    for value, key in ((hub, "tokenizer_class"), (model.get("model_type"), "model_type")):
        if value is not None and not isinstance(value, str):
            raise UsageError(f"--tokenizer: {files.folder}: \"{key}\" is not a string")
    model_type = model.get("model_type")
    registered = _registered().get(model_type) if model_type else None
    if (hub is not None and hub.removesuffix("Fast") == "LlamaTokenizer"
            and model_type not in hf_tables.INCORRECT_HUB_CLASS and b'"ByteLevel"' in raw):
        return None  # a byte-level file (Llama-3's) named LlamaTokenizer: transformers keeps it
    if hub and model_type and registered and registered.removesuffix("Fast") != hub.removesuffix("Fast"):
        registered = registered.removesuffix("Fast")
        if registered not in _GENERIC:
            return _resolved(files, registered if model_type in hf_tables.INCORRECT_HUB_CLASS else hub)
        return None
    if named:
        return _resolved(files, named)
    if hub:
        return _resolved(files, hub)
    return _resolved(files, registered) if registered else None


def _added_token(value: Any, where: str) -> Any:
    from tokenizers import AddedToken

    try:
        return AddedToken(**value)
    except TypeError as exc:
        raise UsageError(f"--tokenizer: {where}: an added token transformers cannot read ({one_line(str(exc))})") from None


def _as_token(value: Any, where: str) -> Any:
    """A config value as transformers' ``convert_added_tokens`` leaves it (a serialized AddedToken made one)."""
    if isinstance(value, dict) and value.get("__type") == "AddedToken":
        return _added_token({k: v for k, v in value.items() if k != "__type"}, where)
    if isinstance(value, dict):
        return {k: _as_token(v, where) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_token(v, where) for v in value]
    return value


def _is_token(value: Any) -> bool:
    from tokenizers import AddedToken

    return isinstance(value, (str, AddedToken))


class _Specials:
    """The added and special tokens transformers' ``from_pretrained`` and ``__init__`` collect from
    the folder: ``decoder`` (id → token, the tokens to add first, in id order), ``named`` (the
    special tokens map, in its order) and ``extra`` (extra_special_tokens)."""

    def __init__(self, files: TokenizerFolder, spec: Mapping[str, Any], defaults: Mapping[str, str | None]) -> None:
        from tokenizers import AddedToken

        where = str(files.config_path)
        kw = dict(files.config)
        if "additional_special_tokens" in kw and not kw.get("extra_special_tokens"):
            kw["extra_special_tokens"] = kw.pop("additional_special_tokens")
        explicit = {k: kw.pop(k) for k in list(kw) if k not in SPECIAL_TOKEN_NAMES and k.endswith("_token")
                    and isinstance(kw[k], str)}
        if isinstance(kw.get("extra_special_tokens"), dict):
            explicit.update(kw.pop("extra_special_tokens"))
        decoder: dict[int, Any] = {}
        if "added_tokens_decoder" in kw:
            given = kw["added_tokens_decoder"]
            if not isinstance(given, dict) or not all(isinstance(v, dict) for v in given.values()):
                raise UsageError(f"--tokenizer: {where}: \"added_tokens_decoder\" is not an object of added tokens")
            try:
                decoder = {int(i): _added_token(v, where) for i, v in given.items()}
            except ValueError:
                raise UsageError(f"--tokenizer: {where}: \"added_tokens_decoder\" has a key that is not an id") from None
        else:
            for key, value in (files.legacy or {}).items():  # special_tokens_map.json, only without the decoder
                if isinstance(value, dict) and key != "extra_special_tokens":
                    value = AddedToken(**{k: v for k, v in value.items() if k != "special"}, special=True)
                elif key == "extra_special_tokens" and isinstance(value, list):
                    merged = list(kw.get("extra_special_tokens") or [])
                    for t in value:
                        t = AddedToken(**t, special=True) if isinstance(t, dict) else t
                        if t not in merged:
                            merged.append(t)
                    value = merged
                kw[key] = value
            if isinstance(kw.get("extra_special_tokens"), dict):
                explicit.update(kw.pop("extra_special_tokens"))
            if files.added is not None:  # added_tokens.json, of older saves
                specials = {str(kw[k]) for k in SPECIAL_TOKEN_NAMES if kw.get(k)}
                specials.update(str(t) for t in (kw.get("extra_special_tokens") or []))
                for text, index in files.added.items():
                    decoder[int(index)] = AddedToken(text, rstrip=False, lstrip=False, normalized=text not in specials,
                                                     special=text in specials)
            for token in spec.get("added_tokens") or []:
                rest = {k: v for k, v in token.items() if k != "id"}
                decoder[int(token["id"])] = _added_token(rest, str(files.tokenizer))
        by_text = {str(t): t for t in decoder.values()}
        kw = {k: _as_token(v, where) for k, v in kw.items()}
        for key in SPECIAL_TOKEN_NAMES:
            if key in kw and by_text and kw[key] is not None:
                kw[key] = by_text.get(str(kw[key]), kw[key])
        explicit = {k: _as_token(v, where) for k, v in explicit.items()}
        kw = {**{k: v for k, v in defaults.items() if k not in kw}, **kw}  # the class's own defaults
        if "additional_special_tokens" in kw and "extra_special_tokens" not in kw:
            kw["extra_special_tokens"] = kw.pop("additional_special_tokens")
        named: dict[str, Any] = dict.fromkeys(SPECIAL_TOKEN_NAMES)
        extra: list[Any] = []
        auto: dict[str, Any] = {}
        for key, value in kw.items():
            if key in SPECIAL_TOKEN_NAMES:
                if value is not None and not _is_token(value):
                    raise UsageError(f"--tokenizer: {where}: \"{key}\" is neither a token nor an AddedToken")
                named[key] = value
            elif key == "extra_special_tokens" and value is not None:
                if isinstance(value, dict):
                    auto.update(value)
                elif isinstance(value, list):
                    extra = list(value)
                else:
                    raise UsageError(f"--tokenizer: {where}: \"extra_special_tokens\" is neither a list nor an object")
            elif key.endswith("_token") and _is_token(value):
                auto[key] = value
        for key, value in {**auto, **explicit}.items():
            if not _is_token(value):
                raise UsageError(f"--tokenizer: {where}: \"{key}\" is neither a token nor an AddedToken")
            named[key] = value
        self.decoder, self.named, self.extra = decoder, named, extra

    def to_add(self, present: list[str]) -> list[Any]:
        """The tokens ``TokenizersBackend.__init__`` adds to a backend holding ``present`` added tokens."""
        from tokenizers import AddedToken

        tokens = [self.decoder[i] for i in sorted(self.decoder)]
        known = set(present) | {str(t) for t in tokens}
        for value in [v for v in self.named.values() if v is not None] + self.extra:
            if str(value) not in known and value not in tokens:
                tokens.append(value)
        names = {str(t) for t in self.named.values() if t}
        out = []
        for token in tokens:
            if isinstance(token, str):
                token = AddedToken(token, special=True)
            elif not token.special and str(token) in names:
                token.special = True
            out.append(token)
        return out

    def all_special(self) -> list[str]:
        """``all_special_tokens``: the named ones, then the extra ones, each once."""
        return list(dict.fromkeys([str(v) for v in self.named.values() if v is not None] + [str(t) for t in self.extra]))


def _rebuilt(spec: Mapping[str, Any], recipe: Recipe, files: TokenizerFolder, name: str) -> str:
    """tokenizer.json as the class's ``__init__`` makes it: the file's vocabulary (a list one made a
    dict, as transformers makes it), merges and post-processor, the class's own parts."""
    model = spec.get("model") or {}
    vocab = model.get("vocab")
    if isinstance(vocab, list):
        vocab = {(t[0] if isinstance(t, list) else t): i for i, t in enumerate(vocab)}
    if not isinstance(vocab, dict):
        raise UsageError(f"--tokenizer: {files.tokenizer}: no vocabulary {name} can take")
    merges = [m.split(" ") if isinstance(m, str) else list(m) for m in model.get("merges") or []]
    if any(len(m) != 2 for m in merges):
        raise UsageError(f"--tokenizer: {files.tokenizer}: a merge that is not a pair of tokens ({name} needs pairs)")
    return json.dumps({
        "version": spec.get("version", "1.0"), "truncation": spec.get("truncation"), "padding": spec.get("padding"),
        "added_tokens": [], "normalizer": recipe.normalizer, "pre_tokenizer": recipe.pre_tokenizer,
        "post_processor": spec.get("post_processor"), "decoder": recipe.decoder,
        "model": {"type": "BPE", **recipe.model, "vocab": vocab, "merges": merges}}, ensure_ascii=False)


def _assembled(files: TokenizerFolder, spec: Mapping[str, Any], text: str, recipe: Recipe | None) -> tuple[str, bool]:
    """(tokenizer.json of ``text`` after what ``TokenizersBackend.__init__`` (and the class's) does
    to it: the config's added and special tokens, a plain post-processor where there is none;
    whether that changed it)."""
    from tokenizers import AddedToken, Tokenizer, processors

    tok = Tokenizer.from_str(text)
    before = tok.to_str()
    specials = _Specials(files, spec, recipe.defaults if recipe is not None else {})
    tok.add_tokens(specials.to_add([t.content for t in tok.get_added_tokens_decoder().values()]))
    if tok.post_processor is None:
        tok.post_processor = processors.TemplateProcessing(single="$A:0", pair="$A:0 $B:1", special_tokens=[])
    if recipe is not None and recipe.readds_specials:
        tok.add_tokens([AddedToken(t, special=True) for t in specials.all_special()])
    after = tok.to_str()
    return after, after != before


def built(files: TokenizerFolder, raw: bytes) -> Built:
    """The tokenizer.json transformers 5 encodes with for this folder (``raw``: the file's bytes,
    a tokenizer.json that ``tokenizers`` loads); a ``UsageError`` for a class shardsmith does not
    build, or a folder transformers itself would refuse."""
    name = class_of(files, raw)
    for key, why in (("split_special_tokens", "special tokens encoded as text"),
                     ("fix_mistral_regex", "a pre-tokenizer transformers patches")):
        if files.config.get(key):
            raise UsageError(f"--tokenizer: {files.config_path}: \"{key}\": {why}, which shardsmith does not reproduce")
    spec = json.loads(raw)
    try:
        as_is, changed = _assembled(files, spec, raw.decode("utf-8"), None)
        after = as_is
        if name is not None:
            recipe = RECIPES[name](files.config)
            after = _assembled(files, spec, _rebuilt(spec, recipe, files, name), recipe)[0]
    except UsageError:
        raise
    except Exception as exc:  # tokenizers raises plain Exceptions from Rust
        raise UsageError(f"--tokenizer: {files.folder}: cannot build the tokenizer as transformers would "
                         f"({one_line(str(exc))})") from None
    if after == as_is:  # the class builds what the file holds (Qwen2.5's, Llama-3's): keep the file's bytes
        return Built(as_is.encode("utf-8"), "TokenizersBackend") if changed else Built(raw, None)
    return Built(after.encode("utf-8"), name)
