"""Where a tokenizer's chat template and special tokens come from, as transformers finds them:
``--chat-template FILE``, else ``chat_template.jinja`` (and ``additional_chat_templates/*.jinja``)
beside the tokenizer, else ``tokenizer_config.json``'s ``"chat_template"``; the special tokens of
``tokenizer_config.json`` (and the older ``special_tokens_map.json``) are the template's variables."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from shardsmith.core.side_file import (
    TEMPLATE_LIMIT,
    TOKENIZER_LIMIT,
    is_side_file,
    read_side_file,
    read_side_text,
)
from shardsmith.errors import UsageError
from shardsmith.text.chat_template import SPECIAL_TOKEN_NAMES, ChatTemplate
from shardsmith.text.tokenizer_folder import TokenizerFolder


def _read_text(path: Path, what: str) -> str:
    return read_side_text(path, what=what, limit=TEMPLATE_LIMIT)


def _token_text(value: Any) -> str | None:
    """A special token's text: a string, or an AddedToken as serialized (``"__type": "AddedToken"``)."""
    if isinstance(value, dict) and value.get("__type") == "AddedToken":
        value = value.get("content")
    return value if isinstance(value, str) else None


def special_tokens_map(config: Mapping[str, Any], *, legacy: Mapping[str, Any] | None = None,
                       padding: Mapping[str, Any] | None = None) -> dict[str, str]:
    """What transformers v5's ``tokenizer.special_tokens_map`` holds for this tokenizer_config.json:
    the named special tokens, then every other ``*_token`` string (and ``extra_special_tokens`` given
    as a dict). ``legacy``: special_tokens_map.json, read only when the config has no
    ``added_tokens_decoder``; ``padding``: tokenizer.json's padding, whose pad_token is used when the
    config does not name one."""
    kw = dict(config)
    if legacy and "added_tokens_decoder" not in kw:
        for key, value in legacy.items():
            kw[key] = {**value, "__type": "AddedToken"} if isinstance(value, dict) else value
    if padding and "pad_token" not in kw and isinstance(padding.get("pad_token"), str):
        kw["pad_token"] = padding["pad_token"]
    out = {name: text for name in SPECIAL_TOKEN_NAMES if (text := _token_text(kw.get(name))) is not None}
    for key, value in kw.items():
        if key.endswith("_token") and key not in SPECIAL_TOKEN_NAMES and (text := _token_text(value)) is not None:
            out[key] = text
    extra = kw.get("extra_special_tokens")
    if isinstance(extra, dict):
        out.update({k: text for k, v in extra.items() if (text := _token_text(v)) is not None})
    return out


def _templates_beside(folder: Path, config: Mapping[str, Any], config_path: Path) -> tuple[Any, str] | None:
    """(template or named templates, where from) as transformers finds them in a tokenizer folder."""
    found: dict[str, str] = {}
    default = folder / "chat_template.jinja"
    if is_side_file(default):
        found["default"] = _read_text(default, "chat template")
    extra = folder / "additional_chat_templates"
    if extra.is_dir():
        for path in sorted(p for p in extra.glob("*.jinja") if not p.is_dir()):
            found[path.name.removesuffix(".jinja")] = _read_text(path, "chat template")
    if found:
        one = list(found) == ["default"]
        return (found["default"], str(default)) if one else (found, str(folder))
    value = config.get("chat_template")
    if isinstance(value, list) and all(isinstance(t, dict) and {"name", "template"} <= t.keys() for t in value):
        value = {t["name"]: t["template"] for t in value}
    if value is None or isinstance(value, str) or (
            isinstance(value, dict) and all(isinstance(v, str) for v in value.values())):
        return None if value is None else (value, str(config_path))
    raise UsageError(f"{config_path}: \"chat_template\" is neither a template nor a list of {{name, template}}")


def load_chat_template(*, tokenizer: str | Path, template_file: str | Path | None) -> ChatTemplate:
    """The chat template for ``tokenizer`` (a tokenizer.json, or its folder): ``template_file``
    (``--chat-template``, Jinja text) when given, else the one transformers would load from the
    tokenizer's folder; its variables are the special tokens of that folder's tokenizer_config.json,
    as transformers' ``special_tokens_map`` gives them. No template anywhere, a file that cannot be
    read or a template that does not compile is a ``UsageError`` naming the file."""
    files = TokenizerFolder.read(tokenizer)
    folder, config, config_path, legacy = files.folder, files.config, files.config_path, files.legacy
    padding = _tokenizer_padding(files.tokenizer) if "pad_token" not in config and is_side_file(files.tokenizer) else None
    variables = special_tokens_map(config, legacy=legacy, padding=padding if isinstance(padding, dict) else None)
    if template_file is not None:
        where = str(template_file)
        source: Any = _read_text(Path(template_file), "--chat-template")
    else:
        found = _templates_beside(folder, config, config_path)
        if found is None:
            raise UsageError(f"--tokenizer {tokenizer}: no chat template (no \"chat_template\" in {config_path}, "
                             f"no chat_template.jinja beside it): pass --chat-template FILE")
        source, where = found
    if isinstance(source, dict) and "default" not in source and "tool_use" not in source:
        raise UsageError(f"{where}: named chat templates without a 'default' one ({', '.join(sorted(source))})")
    template = ChatTemplate(source=source, variables=variables)
    problem = template.syntax_error()
    if problem is not None:
        name, message = problem
        which = f" {name!r}" if template.named else ""
        raise UsageError(f"{where}: the chat template{which} does not compile ({message})")
    return template


def _tokenizer_padding(path: Path) -> Any:
    """tokenizer.json's "padding" (transformers takes its pad_token when the config has none); a
    file that is no JSON object has none (it is refused where it is loaded)."""
    import orjson

    try:
        return orjson.loads(read_side_file(path, what="--tokenizer", limit=TOKENIZER_LIMIT)).get("padding")
    except (ValueError, AttributeError):
        return None
