"""What a run takes from its tokenizer besides the ids: special tokens, vocabulary size, padding.

Worked out once, by the first process of a run (``engine.inputs.plan.cached``): the gather and finalize
stages of a cluster run read them from the run's scratch folder instead of loading the tokenizer
again (importing and parsing it with ``tokenizers`` was 0.07 s of a 0.27 s gather process), nor
does a scatter rank whose engine decision was saved too. Every
usage error about the tokenizer is raised here, so the first process reports it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from shardsmith.errors import UsageError
from shardsmith.formats.tokens import neighbours
from shardsmith.text import tokenize as tk

PAD_CANDIDATES = ("<pad>", "[PAD]", "<|pad|>", "<|padding|>", "<|endoftext|>")
NANOGPT_VOCAB = 65536  # nanoGPT reads uint16 tokens


@dataclass(frozen=True, kw_only=True)
class TokenizerFacts:
    json: str  # the tokenizer as tokenizers writes it back: what every engine is built from
    sha256: str  # of the tokenizer.json the run encodes with (the file as given, or as transformers builds it)
    eos: str | None  # appended to every document (None: --no-eos)
    eos_id: int | None
    bos_id: int | None
    vocab_size: int
    pad_id: int | None  # what packed sequences are padded with (--pack), else None
    pad: str | None  # the padding token the companion files name
    built_as: str | None = None  # the class transformers builds the tokenizer with (None: tokenizer.json as given)

    @classmethod
    def of(cls, opts: Any, hf: Any, *, json: str, sha256: str, source: Path, built_as: str | None = None
           ) -> TokenizerFacts:
        """The facts of ``hf`` (loaded from ``source``) under the run's options."""
        # --chat: the chat template places every special token, nothing is added
        eos = None if opts.no_eos or opts.chat else (opts.eos_token or tk.default_eos(hf))
        if eos is None and not (opts.no_eos or opts.chat):
            raise UsageError(f"--tokenizer {source}: no end-of-text token among its special tokens; "
                             f"name one with --eos-token or pass --no-eos")
        eos_id = tk.special_id(hf, eos, "--eos-token") if eos else None
        bos_id = tk.special_id(hf, opts.bos_token, "--bos-token") if opts.bos_token else None
        vocab_size = hf.get_vocab_size(with_added_tokens=True)
        if opts.nanogpt and vocab_size > NANOGPT_VOCAB:
            raise UsageError(f"--nanogpt: nanoGPT reads uint16 tokens, but the vocabulary has {vocab_size} entries")
        pad_id = pad_id_of(opts, hf, eos_id, vocab_size) if opts.pack is not None else None
        return cls(json=json, sha256=sha256, eos=eos, eos_id=eos_id, bos_id=bos_id, vocab_size=vocab_size, pad_id=pad_id,
                   pad=neighbours.found_pad(hf, pad_id if pad_id is not None else opts.pad_id), built_as=built_as)

    def dump(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def load(cls, saved: dict[str, Any]) -> TokenizerFacts:
        return cls(**saved)


def pad_id_of(opts: Any, hf: Any, eos_id: int | None, vocab_size: int) -> int:
    """``--pad-id``, else the tokenizer's padding token, else a usual pad token among its specials,
    else the end-of-text id (the one appended, else the tokenizer's usual one)."""
    if opts.pad_id is not None:
        if not 0 <= opts.pad_id < vocab_size:
            raise UsageError(f"--pad-id {opts.pad_id}: outside the tokenizer's vocabulary of {vocab_size}")
        return opts.pad_id
    padding = hf.padding
    if padding and padding.get("pad_id") is not None and 0 <= padding["pad_id"] < vocab_size:
        return int(padding["pad_id"])
    specials = {t.content: i for i, t in hf.get_added_tokens_decoder().items() if t.special}
    found = next((specials[c] for c in PAD_CANDIDATES if c in specials), eos_id)
    if found is None and (eos := tk.default_eos(hf)) is not None:  # --no-eos, --chat: the usual eos still pads
        found = tk.special_id(hf, eos, "--pad-id")
    if found is None:
        raise UsageError("--pack: the tokenizer names no padding or end-of-text token; give --pad-id")
    return int(found)
