"""The steps of ``pack-tokens``' job (``engine.job.JobSteps``): the tokenizer's work between the
engine's own steps. Every process of a run (every stage of a cluster run) goes through them; what
is worked out once (a trained tokenizer, the tokenizer's facts, the engine check) is kept in the
run's scratch folder (``engine.inputs.plan.cached``) for the others.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from shardsmith import registry
from shardsmith.commands import nanogpt_split
from shardsmith.commands.chat_options import check_chat
from shardsmith.commands.engine_check import check_engine as checked_engine
from shardsmith.commands.token_facts import TokenizerFacts
from shardsmith.core.fsutil import atomic_write_bytes
from shardsmith.core.progress import Progress
from shardsmith.core.side_file import TOKENIZER_LIMIT, check_side_file
from shardsmith.core.text_field import why_no_text
from shardsmith.engine import Converted, Described, JobRun, JobSteps
from shardsmith.engine.inputs.plan import cached, task_bytes
from shardsmith.engine.output.outdir import work_path
from shardsmith.errors import DataError, UsageError
from shardsmith.formats.tokens import neighbours
from shardsmith.kit.format import Format
from shardsmith.kit.options import FormatOptions, OptionValues
from shardsmith.kit.reader import BadRecord, MultiReader, RecordError, Task
from shardsmith.kit.transform import Transform, apply_all, build_transforms, transform_inputs
from shardsmith.storage import arrival
from shardsmith.text import tokenize as tk
from shardsmith.text import tokenizer_folder
from shardsmith.text.cleaning import CleaningSpec
from shardsmith.text.engine_choice import PIECE_CHECK_DOCS, SAMPLE_BYTES, SAMPLE_DOC_CHARS, SAMPLE_DOCS
from shardsmith.text.token_processor import TokenProcessor


class TokenSteps(JobSteps):
    """Text into tokens: every rows source reads the text field; the tokenizer trained or loaded,
    its engine checked on a sample, its files beside the dataset."""

    desc = "tokenize"

    def open(self, run: JobRun) -> JobSteps:
        opts = run.opts
        if (opts.tokenizer is None) == (opts.train_tokenizer is None):
            raise UsageError("give exactly one of --tokenizer FILE and --train-tokenizer VOCAB_SIZE")
        if opts.no_eos and opts.eos_token:
            raise UsageError("--no-eos and --eos-token contradict each other")
        check_packing(opts)
        check_chat(opts)
        if opts.tokenizer is not None:  # before the run hashes them: a FIFO or a huge file is refused, not read
            check_side_file(opts.tokenizer, what="--tokenizer", limit=TOKENIZER_LIMIT)
            tokenizer_folder.TokenizerFolder.read(opts.tokenizer)
        self.transforms = build_transforms(self.job.transforms, holds="rows", opts=opts)
        run.opts = opts = self.checked(opts)
        self.default_val = opts.nanogpt and nanogpt_split.check_names(opts.splits)  # the share comes with the sample
        # every source whose records have a text field (``RecordKind.text_fields``): JSONL and Parquet, any plugin's
        run.reader = MultiReader(readers=[self.reader_of(cls, opts) for cls in registry.sources_with_text()])
        run.fmt = registry.format_named(self.job.format or "tokens")
        return self

    def checked(self, opts: Any) -> Any:
        """The options as the steps run them, refused where they contradict each other (a hook)."""
        return opts

    def reader_of(self, cls: Any, opts: Any) -> Any:
        """The reader of a rows source for this run: of the text field (a hook)."""
        return cls.for_text(opts.text_field)

    def text_of(self, value: Any) -> str:
        """The text a row gives the tokenizer (after the transforms); a RecordError says why none (a hook)."""
        field = self.job.opts.text_field
        text = value.get(field) if isinstance(value, dict) else None
        if not isinstance(text, str):
            raise RecordError(why_no_text(value, field))
        return text

    def extra_inputs(self, run: JobRun) -> tuple[str | None, ...]:
        """The tokenizer, the files beside it that decide what transformers builds of it, the benchmarks."""
        tokenizer = run.opts.tokenizer
        return (*(tokenizer_folder.tokenizer_inputs(tokenizer) if tokenizer else ()), *run.opts.decontaminate,
                *transform_inputs(self.transforms))

    def cleaning(self, run: JobRun) -> CleaningSpec | None:
        return CleaningSpec.of(run.opts, units="tokens")

    def processor(self, run: JobRun) -> TokenProcessor:
        """The tokenizer (trained, or checked), its engine, its companion files; the write job."""
        opts, reader, tasks, progress, run_id = run.opts, run.reader, run.tasks, run.progress, run.identity
        transforms = self.transforms
        # the dataset's own copy; scatter ranks write only to the scratch folder (the output folder may
        # still hold a finished dataset, which the gather refuses)
        home = work_path(opts.out) if opts.stage == "scatter" else opts.out
        home.mkdir(parents=True, exist_ok=True)
        if opts.train_tokenizer is not None:
            _write_changed(home / neighbours.TOKENIZER, _trained(opts, reader, tasks, progress, run_id, transforms,
                                                             self.text_of))
            tok_path = home / neighbours.TOKENIZER
        else:
            tok_path = Path(opts.tokenizer)
        tokenizing = opts.stage in (None, "scatter")  # gather and finalize only move tokens
        hf = None  # the reference tokenizer, loaded only by a process that checks the engine

        def read_facts() -> TokenizerFacts:
            nonlocal hf
            loaded = tk.load_hf(tok_path)
            hf = loaded.tok
            return TokenizerFacts.of(opts, hf, json=loaded.json, sha256=loaded.sha256, source=tok_path,
                                     built_as=loaded.built_as)

        facts = cached("tokenizer-facts", read_facts, stage=opts.stage, out=opts.out, run=run_id,
                       dump=TokenizerFacts.dump, load=TokenizerFacts.load)
        if tok_path != home / neighbours.TOKENIZER:  # the one the ids come from: as given, or as transformers built it
            _write_changed(home / neighbours.TOKENIZER, facts.json.encode("utf-8") if facts.built_as
                           else tk.tokenizer_bytes(tok_path))

        loaded = None  # gigatoken built by the engine check: workers forked later inherit it (a decision
        # kept in the scratch folder leaves it to each worker)

        def check_engine() -> tuple[str, str, bool, float | None]:
            nonlocal loaded, hf
            if hf is None:  # the facts came from the run's scratch folder
                hf = tk.load_hf(tok_path).tok
            with progress.bar(total=None, desc="engine check", unit=" documents") as bar:
                got = _sample(reader, tasks, self.text_of, transforms)
                engine, why, safe, loaded = checked_engine(opts.engine, hf, facts.json, got.texts,
                                                           piece_docs=PIECE_CHECK_DOCS, tick=bar.update)
            share = nanogpt_split.default_share(got, input_bytes=sum(f.size for f in run.files or ())) \
                if self.default_val else None
            return engine, why, safe, share

        engine, why, safe, val_share = cached("engine", check_engine, stage=opts.stage, out=opts.out, run=run_id,
                                              dump=list, load=tuple)
        progress.note(f"engine: {engine} ({why})" + ("" if safe else f"; documents over {tk.PIECE_CHARS:,} characters "
                                                      f"are refused: this tokenizer's ids change when they are cut"))
        if opts.pack is not None:
            opts = dataclasses.replace(opts, pad_id=facts.pad_id, pack_window=window_of(opts))
        if val_share is not None:
            opts = dataclasses.replace(opts, splits=nanogpt_split.splits_with(val_share))
        run.opts = opts
        companions = self.hf_files(facts, opts)
        if opts.nanogpt:
            companions[neighbours.NANOGPT_META] = neighbours.nanogpt_meta(facts.vocab_size)
        self.companions = neighbours.write_companions(home, companions, write=_write_changed)
        input_bytes = sum(f.size for f in run.files or ())
        spec = tk.TokenizerSpec(json=facts.json, engine=engine, eos_id=facts.eos_id, bos_id=facts.bos_id,
                                vocab_size=facts.vocab_size, piece_chars=tk.PIECE_CHARS if safe else None,
                                batch_chars=tk.BATCH_CHARS if input_bytes >= tk.BATCH_RUN_BYTES else None)
        run.make_write(schema=self.payload_dtype(spec), options=format_values(run.fmt, opts))
        self.facts, self.spec, self.engine, self.why, self.val_share = facts, spec, engine, why, val_share
        return self.make_processor(spec, opts, loaded=loaded if tokenizing else None, tokenizing=tokenizing)

    def payload_dtype(self, spec: tk.TokenizerSpec) -> np.dtype:
        """What one token is in the payload the workers hand the scatter (a hook)."""
        return spec.dtype

    def hf_files(self, facts: TokenizerFacts, opts: Any) -> dict[str, bytes]:
        """The tokenizer's companion files for transformers (a hook)."""
        return neighbours.hf_files(neighbours.SpecialTokens(eos=facts.eos, bos=opts.bos_token, pad=facts.pad))

    def make_processor(self, spec: tk.TokenizerSpec, opts: Any, *, loaded: Any, tokenizing: bool) -> Any:
        """What turns a batch of rows into token payloads in the workers (a hook)."""
        return TokenProcessor(spec=spec, text_field=opts.text_field, transforms=self.transforms,
                              encoder=tk.Encoder(spec, loaded=loaded) if tokenizing else None)

    def describe(self, run: JobRun, done: Converted) -> Described:
        opts, facts, files, kinds = run.opts, self.facts, run.files or [], run.reader.kinds(run.files or [])
        if opts.nanogpt:
            nanogpt_split.check_filled({name: sum(s.samples for s in o.shards) for name, o in done.outputs.items()},
                                       default=self.val_share is not None)
        tokenizer = {"path": neighbours.TOKENIZER, "sha256": facts.sha256, "vocab_size": facts.vocab_size,
                     "eos_token": facts.eos, "eos_id": facts.eos_id, "bos_token": opts.bos_token, "bos_id": facts.bos_id,
                     "dtype": self.spec.dtype.name, "engine": self.engine, "engine_reason": self.why,
                     "trained": opts.train_tokenizer is not None,
                     # the class transformers 5 builds the tokenizer with from its folder (text/tokenizer_class.py)
                     **({"built_as": facts.built_as} if facts.built_as else {}),
                     # a small corpus runs out of merges before the asked size: both are recorded, and said
                     **({"vocab_size_asked": opts.train_tokenizer} if opts.train_tokenizer is not None else {})}
        source = {"reader": "+".join(kinds), "text_field": opts.text_field, "inputs_sha256": _inputs_digest(files)}
        if opts.provenance:  # what ``trace`` checks an input against, and how it names a record of it
            source.update(input_sizes=[f.size for f in files], input_units=[run.reader.unit_for(f) for f in files])
            if (where := _input_dir(files)) is not None:
                source["input_dir"] = where
        return Described(
            source=source,
            schema={"tokens": {"kind": "tokens", "dtype": self.spec.dtype.name, "ragged": True}},
            extras={"tokenizer": tokenizer, "seq_len": opts.seq_len, "companions": self.companions,
                    **({"nanogpt_default_val": self.val_share} if self.val_share is not None else {}),
                    **({"transforms": [t.describe() for t in self.transforms]} if self.transforms else {})},
            used=(*(("source", kind) for kind in kinds), *(("transform", t.name) for t in self.transforms)),
            written=None if opts.pack is None else sum(s.extra["documents"] for o in done.outputs.values()
                                                       for s in o.shards),
            list_inputs=opts.provenance)


def _texts(reader: MultiReader, tasks: list[Task], text_of: Callable[[Any], str], *, on_error: str,
           transforms: list[Transform], tick: Callable[[int], Any] | None = None) -> Iterator[str]:
    """The text of every good record in input order, after the transforms (for training and sampling);
    ``text_of``: a row's text (``TokenSteps.text_of``); ``tick`` is told the bytes of each task read."""
    for task in tasks:
        arrival.wait_whole((task.file,))  # an input still being staged from a URL
        for record, value in reader.read(task):
            text = why = None
            try:
                if isinstance(value, BadRecord):
                    why = value.reason
                else:
                    if transforms:
                        value = apply_all(transforms, value, file=task.file.rel, record=record)
                    text = text_of(value)
            except RecordError as exc:
                why = str(exc)
            if text is not None:
                yield text
            elif on_error == "fail":
                reason = why
                raise DataError(file=task.file.rel, record=record, reason=reason, unit=reader.unit_for(task.file),
                                skippable=True)
        if tick is not None:
            tick(task.nbytes)


def _write_changed(path: Path, data: bytes) -> None:
    """Write ``data`` unless the file already holds it (every stage of a staged run passes here)."""
    try:
        if path.read_bytes() == data:
            return
    except OSError:
        pass
    atomic_write_bytes(path, data)


def _trained(opts: Any, reader: MultiReader, tasks: list[Task], progress: Progress,
             run_id: dict[str, str], transforms: list[Transform], text_of: Callable[[Any], str]) -> bytes:
    """A byte-level BPE trained on the inputs (in a cluster stage, once per run: training is
    deterministic, so ranks racing to save it save the same JSON)."""

    def train() -> str:
        progress.note(f"training a byte-level BPE of {opts.train_tokenizer} tokens on the inputs")
        with progress.bar(total=task_bytes(tasks), desc="train tokenizer: counting words", unit="B") as bar:
            texts = _texts(reader, tasks, text_of, on_error=opts.on_error, transforms=transforms, tick=bar.update)

            def words() -> Iterator[str]:
                # long documents in pieces cut at spaces: the same words to count, in bounded memory
                for t in texts:
                    yield from tk.pieces(t) or [t[:tk.PIECE_CHARS]]
                bar.set_description("train tokenizer: merging")  # every input read; the merges take a while

            return tk.train_bpe(words(), vocab_size=opts.train_tokenizer)

    return cached("tokenizer", train, stage=opts.stage, out=opts.out, run=run_id, dump=str, load=str).encode()


def _sample(reader: MultiReader, tasks: list[Task], text_of: Callable[[Any], str], transforms: list[Transform]
            ) -> nanogpt_split.Sample:
    """The first documents of the input, to check that an engine matches the reference (and to
    estimate how many documents the input holds)."""
    out: list[str] = []
    size = chars = 0
    whole = True
    try:
        for text in _texts(reader, tasks, text_of, on_error="skip", transforms=transforms):
            chars += len(text)
            text = text[:SAMPLE_DOC_CHARS]  # any text is a probe: never encode a huge document whole here
            out.append(text)
            size += len(text)
            if len(out) >= SAMPLE_DOCS or size >= SAMPLE_BYTES:
                whole = False
                break
    except DataError:
        whole = False  # the real pass reports it with the user's --on-error
    return nanogpt_split.Sample(texts=out, chars=chars, whole=whole)


def _input_dir(files: list[Any]) -> str | None:
    """The local folder the inputs' names are relative to (absolute), where ``trace`` finds them
    again; None for inputs from a URL (their ``input_root`` says where)."""
    from shardsmith.engine.inputs.url_inputs import input_root

    if not files or input_root(files) is not None:
        return None
    roots = {f.path[:-len(f.rel)] if f.path.replace(os.sep, "/").endswith(f.rel) else None for f in files}
    root = roots.pop() if len(roots) == 1 else None
    return None if root is None else os.path.abspath(root or ".")


def _inputs_digest(files: list[Any]) -> str:
    """A cheap fingerprint of the inputs: names and sizes (not contents)."""
    h = hashlib.sha256()
    for f in files:
        h.update(f"{f.rel}\0{f.size}\n".encode())
    return h.hexdigest()


def format_values(fmt: Format, opts: Any) -> OptionValues:
    """The format's options as its writers get them (``job.options``): their values in the job's
    options record, which names them as the format declares them (``formats/tokens/options.py``), the
    padding and the window as the tokenizer decided them."""
    declared = fmt.options or FormatOptions(to=None)
    return declared.values({name: getattr(opts, name) for name in declared.names()})


def window_of(opts: Any) -> int:
    """``--pack-window``, else the default: the tokens best-fit packs at once (never from --memory, so
    the packed bytes do not depend on it)."""
    from shardsmith.formats.tokens.packing import DEFAULT_WINDOW_TOKENS

    return opts.pack_window or DEFAULT_WINDOW_TOKENS


def check_packing(opts: Any) -> None:
    """The packing options together, before any work (one-line usage errors)."""
    if opts.pack is None:
        for given, option in ((opts.pad_id, "--pad-id pads"), (opts.pack_window, "--pack-window sizes")):
            if given is not None:
                raise UsageError(f"{option} packed sequences: give --pack best-fit too")
        return
    if opts.pack != "best-fit":
        raise UsageError(f"--pack {opts.pack!r}: the one packing is 'best-fit'")
    if opts.seq_len is None:
        raise UsageError("--pack best-fit needs --seq-len N, the length of every packed sequence")
    if not 1 <= opts.seq_len < 1 << 31:
        raise UsageError(f"--seq-len {opts.seq_len}: out of range [1, 2**31)")
    if opts.nanogpt:
        raise UsageError("--nanogpt writes documents back to back without padding: it does not combine with --pack")
    from shardsmith.core.sizes import format_size
    from shardsmith.formats.tokens.packing import MIN_SEQUENCES, window_bytes

    window = window_of(opts)
    if window < MIN_SEQUENCES * opts.seq_len:
        raise UsageError(f"--pack-window {window:,} tokens holds fewer than {MIN_SEQUENCES} sequences of --seq-len "
                         f"{opts.seq_len:,}: give --pack-window {MIN_SEQUENCES * opts.seq_len} or more")
    if opts.memory < window_bytes(window, chat=opts.chat):
        raise UsageError(f"--memory {format_size(opts.memory)} cannot hold a packing window of --pack-window "
                         f"{window:,} tokens: give --memory {format_size(window_bytes(window, chat=opts.chat))} or more, "
                         f"or a smaller --pack-window")
