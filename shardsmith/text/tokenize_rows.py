"""The ``tokenize`` transform: a row's text tokenized, its ids a field beside the others
(``convert --transform tokenize=tokenizer.json``). Tokens are then a format like any other: MDS,
Parquet and Lance hold each document's ids as a column that their own readers give back
(``StreamingDataset``, pyarrow, Lance's ``take``), where ``--to tokens`` packs them into one array.

Spec: ``FILE[,field=NAME][,to=NAME][,eos=TOKEN|none][,bos=TOKEN][,engine=auto|hf|gigatoken]``. ``field``: the text (default:
the one ``--text-field`` names, else ``text``); ``to``: the new field (default ``input_ids``; a row
that already has it is a bad record, never overwritten).

The ids are pack-tokens' own: the file loaded as it loads it (``tokenize.load_hf``: the tokenizer
transformers 5 builds of its folder, truncation and padding off) and encoded by the same
``tokenize.Encoder``: without the tokenizer's post-processor specials (``add_special_tokens=False``),
then the end-of-text id appended (the tokenizer's usual one, pack-tokens' default; ``eos=TOKEN``
another, ``eos=none`` none) and ``bos=TOKEN``'s id prepended. A document's ids are a 1-D numpy array
in the dtype pack-tokens writes (``core.dtypes.token_dtype``, Megatron's choice): ``uint16`` for a
vocabulary under 65,500 ids, else ``int32`` (what torch embeds; no id reaches 2**31).

The engine is pack-tokens' choice, made the same way (``text/engine_choice.py``; spec
``engine=auto|hf|gigatoken``, default ``auto``): before the workers start, the run shows the
transform the input's first documents (``Transform.prepare``), and gigatoken encodes them only
where it gave ``tokenizers``' ids on them and the probes; else ``tokenizers`` (the reference), a row
at a time. Where no run prepares it (a caller of ``apply`` alone), the reference.

Everything about the file is checked once, in the process that builds the transform (``from_spec``,
before any work): it is read and parsed, its special tokens found, and whether long documents may
be cut into pieces without changing their ids (``tokenize.piece_safe``, on the probes). The workers
get the decided ``TokenizerSpec`` (the JSON text, no live objects) and build their encoder on
first use; the file and those beside it that change its ids are part of the run's identity
(``inputs``): an edited tokenizer is a new run, never a resumed one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from shardsmith.core.text_field import why_no_text
from shardsmith.errors import UsageError
from shardsmith.kit.reader import RecordError
from shardsmith.kit.transform import Transform
from shardsmith.text import tokenize as tk
from shardsmith.text.engine_choice import (
    PIECE_CHECK_DOCS,
    SAMPLE_BYTES,
    SAMPLE_DOC_CHARS,
    SAMPLE_DOCS,
    decide_engine,
    in_process,
)
from shardsmith.text.tokenizer_folder import tokenizer_inputs

SYNTAX = "tokenize=FILE[,field=NAME][,to=NAME][,eos=TOKEN|none][,bos=TOKEN][,engine=auto|hf|gigatoken]"
_KEYS = ("field", "to", "eos", "bos", "engine")


class TokenizeText(Transform):
    """A row's text field encoded into token ids, added as another field (the module docstring)."""

    name = "tokenize"
    applies_to = ("rows",)
    samples = True  # the engine is checked on the input's first documents

    def __init__(self, *, path: str, field: str, to: str, spec: tk.TokenizerSpec, sha256: str,
                 eos: str | None, bos: str | None, engine: str = "auto", tok: Any = None) -> None:
        """``spec``: the reference's (``hf``) until ``prepare`` decides; ``engine``: the one asked
        for; ``tok``: the ``tokenizers`` object the check compares with (built from ``spec`` if None)."""
        self.path, self.field, self.to = path, field, to
        self.spec, self.sha256, self.eos, self.bos = spec, sha256, eos, bos
        self.engine, self.why = engine, "not checked: the reference"
        self._tok = tok
        self._loaded: Any = None  # gigatoken as the engine check built it
        self._encoder: tk.Encoder | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_encoder": None, "_tok": None, "_loaded": None}  # each worker builds its own

    @classmethod
    def from_spec(cls, spec: str | None, *, opts: Any) -> TokenizeText:
        path, options = _parsed(spec)
        what = "--transform tokenize"
        loaded = tk.load_hf(path, what=what)
        tok = loaded.tok
        eos = options.get("eos", tk.default_eos(tok))
        if eos is None and "eos" not in options:
            raise UsageError(f"{what}: {path}: no end-of-text token among its special tokens; name one with "
                             f"eos=TOKEN, or append none with eos=none")
        eos = None if eos == "none" else eos
        bos = options.get("bos")
        decided = tk.TokenizerSpec(
            json=loaded.json, engine="hf", vocab_size=tok.get_vocab_size(with_added_tokens=True),
            eos_id=tk.special_id(tok, eos, f"{what} eos") if eos else None,
            bos_id=tk.special_id(tok, bos, f"{what} bos") if bos else None,
            piece_chars=tk.PIECE_CHARS if tk.piece_safe(tok, []) else None)
        field = options.get("field") or getattr(opts, "text_field", None) or "text"
        engine = options.get("engine", "auto")
        if engine not in tk.ENGINES:
            raise UsageError(f"{what}: engine={engine}: expected one of {', '.join(tk.ENGINES)}")
        return cls(path=path, field=field, to=options.get("to", "input_ids"), spec=decided, sha256=loaded.sha256,
                   eos=eos, bos=bos, engine=engine, tok=tok)

    def prepare(self, records: Iterator[Any]) -> dict[str, Any]:
        """The engine, decided on the first documents of ``records`` as pack-tokens decides it: the
        same sample bounds, the probes, the piece check (which may also allow or refuse cutting)."""
        texts: list[str] = []
        size = 0
        for value in records:
            text = value.get(self.field) if isinstance(value, dict) else None
            if isinstance(text, str):
                texts.append(text[:SAMPLE_DOC_CHARS])
                size += len(texts[-1])
                if len(texts) >= SAMPLE_DOCS or size >= SAMPLE_BYTES:
                    break
        tok = self._tok if self._tok is not None else tk.Encoder(self.spec)._hf
        engine, why, safe, self._loaded = decide_engine(self.engine, tok, self.spec.json, texts,
                                                        piece_docs=PIECE_CHECK_DOCS, start_reference=in_process(tok))
        return {"engine": engine, "why": why, "safe": safe}

    def prepared(self, decision: dict[str, Any]) -> None:
        self.spec = dataclasses.replace(self.spec, engine=decision["engine"],
                                        piece_chars=tk.PIECE_CHARS if decision["safe"] else None)
        self.why = decision["why"]
        # gigatoken built by the check here: workers forked later inherit it (spawned ones build their own)
        loaded = self._loaded if self.spec.engine == "gigatoken" else None
        self._encoder = tk.Encoder(self.spec, loaded=loaded) if loaded is not None else None

    def apply(self, value: Any, *, identity: str, copy: int) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise RecordError(f"expected a row of named fields, got {type(value).__name__}")
        text = value.get(self.field)
        if not isinstance(text, str):
            if self.field not in value:
                raise RecordError(f"no {self.field!r} field to tokenize (fields: {', '.join(list(value)[:8])}); "
                                  f"name the text with {self.name}=FILE,field=NAME")
            raise RecordError(why_no_text(value, self.field))
        if self.to in value:
            raise RecordError(f"the row has a field {self.to!r} already: name the token ids' field with "
                              f"{self.name}=FILE,to=NAME")
        if (why := tk.too_long(text, piece_chars=self.spec.piece_chars)) is not None:
            raise RecordError(why)
        if self._encoder is None:
            self._encoder = tk.Encoder(self.spec)
        ids, _ = self._encoder.encode([text])
        if not len(ids):  # (an array of no ids is none to MDS, whose readers refuse it)
            raise RecordError(f"{self.field!r} is empty and eos=none appends nothing: a document of no tokens")
        return {**value, self.to: ids}

    def inputs(self) -> tuple[str, ...]:
        return tokenizer_inputs(self.path)

    def fields_after(self, schema: dict[str, Any]) -> dict[str, Any]:
        """The ids' field beside the source's: each document's tokens, of the dtype pack-tokens writes."""
        return {**schema, self.to: {"kind": "tokens", "dtype": self.spec.dtype.name, "ragged": True}}

    def describe(self) -> dict[str, Any]:
        return {"transform": self.name, "tokenizer": Path(self.path).name, "sha256": self.sha256, "field": self.field,
                "to": self.to, "eos_token": self.eos, "eos_id": self.spec.eos_id, "bos_token": self.bos,
                "bos_id": self.spec.bos_id, "vocab_size": self.spec.vocab_size, "dtype": self.spec.dtype.name,
                "engine": self.spec.engine, "engine_reason": self.why}


def _parsed(spec: str | None) -> tuple[str, dict[str, str]]:
    """The tokenizer file and the ``KEY=VALUE`` options after it; a one-line usage error otherwise."""
    path, *rest = (spec or "").split(",")
    if not path.strip() or "=" in path:
        raise UsageError(f"--transform {SYNTAX}: name the tokenizer file first")
    options: dict[str, str] = {}
    for part in rest:
        key, eq, val = part.partition("=")
        key = key.strip()
        if key not in _KEYS or not eq or not val.strip():
            raise UsageError(f"--transform tokenize: {part.strip()!r}: expected {SYNTAX}")
        if key in options:
            raise UsageError(f"--transform tokenize: {key} is given twice")
        options[key] = val.strip()
    return path.strip(), options
