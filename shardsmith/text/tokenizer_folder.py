"""The small files transformers reads beside a ``tokenizer.json``: ``tokenizer_config.json`` (the
tokenizer class, its special and added tokens, the chat template), the older
``special_tokens_map.json``, and a model's ``config.json`` (its ``model_type``, which can change
the class AutoTokenizer picks). Read once, each a checked side file (``core/side_file.py``): a
FIFO or a device in the folder is refused, not waited on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shardsmith.core.side_file import CONFIG_LIMIT, is_side_file, read_side_text
from shardsmith.errors import UsageError
from shardsmith.text.chat_template import one_line

CONFIG = "tokenizer_config.json"
LEGACY_SPECIALS = "special_tokens_map.json"
MODEL_CONFIG = "config.json"
ADDED_TOKENS = "added_tokens.json"
FILES = (CONFIG, LEGACY_SPECIALS, MODEL_CONFIG, ADDED_TOKENS)  # what the tokenizer's ids and specials may depend on


def tokenizer_inputs(tokenizer: str | Path) -> tuple[str, ...]:
    """The tokenizer file and the files beside it that decide what transformers builds of it: what
    a run's identity hashes (``engine/output/resume.py``), so that an edited one is a new run."""
    return (str(tokenizer), *(str(Path(tokenizer).parent / name) for name in FILES))


def read_json(path: Path, what: str) -> Any:
    """A JSON side file, parsed; a one-line ``UsageError`` naming it otherwise."""
    text = read_side_text(path, what=what, limit=CONFIG_LIMIT)
    try:
        return json.loads(text)
    except ValueError as exc:
        raise UsageError(f"{what}: {path}: not valid JSON ({one_line(str(exc))})") from None


def _object(path: Path, what: str) -> dict[str, Any] | None:
    """The JSON object in ``path``, or None when there is no such file."""
    if not is_side_file(path):
        return None
    value = read_json(path, what)
    if not isinstance(value, dict):
        raise UsageError(f"{what}: {path}: not a JSON object")
    return value


@dataclass(frozen=True, kw_only=True)
class TokenizerFolder:
    """``tokenizer``: the tokenizer.json (given, or in the folder given); ``config``: its
    tokenizer_config.json ({} without one); ``legacy``: special_tokens_map.json; ``model``:
    config.json; ``added``: added_tokens.json (None without them)."""

    tokenizer: Path
    folder: Path
    config: dict[str, Any] = field(default_factory=dict)
    legacy: dict[str, Any] | None = None
    model: dict[str, Any] | None = None
    added: dict[str, Any] | None = None

    @property
    def config_path(self) -> Path:
        return self.folder / CONFIG

    @classmethod
    def read(cls, tokenizer: str | Path) -> TokenizerFolder:
        path = Path(tokenizer)
        folder = path if path.is_dir() else path.parent
        return cls(tokenizer=folder / "tokenizer.json" if path.is_dir() else path, folder=folder,
                   config=_object(folder / CONFIG, "--tokenizer") or {},
                   legacy=_object(folder / LEGACY_SPECIALS, "--tokenizer"),
                   model=_object(folder / MODEL_CONFIG, "--tokenizer"),
                   added=_object(folder / ADDED_TOKENS, "--tokenizer"))
