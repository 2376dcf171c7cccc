"""The simulation checked against a real run: ``pack-tokens`` with its stages as processes, and the
simulation of the same run, unit by unit, counted the same way.

    python bench/sim_check.py                     # ~3 s: 1 MB of JSONL, 2 ranks
    python bench/sim_check.py --mb 20 --ranks 4

A small JSONL corpus and a byte-level tokenizer are made; ``pack-tokens`` runs as a cluster would
run it, every unit (W scatter ranks, W gather ranks, finalize) a process of its own (forked from
this one, the CLI's own ``main`` with ``--stage``), each measured by ``sim_meter`` around the
engine's ``convert_units`` (the unit itself: not the start-up, the listing and the claim that
every stage repeats). The documents its scatter wrote are read back from its part files
(``sim_workload.RecordedWorkload``), and the simulation runs the same units on them: its own
scatter, writing the parts with holes for payloads, and the engine's gather and finalize on those.

What must be equal, and is checked: each part file, byte for byte but the payloads; per unit, the
opens of the scratch folder (and of part files), the metadata read (bytes its read calls returned
less the payload), the bytes written (the simulation's holes counted as written), the part files
punched to give back spill. Not compared: the scatter's reads (the real one reads the input), CPU
and memory (the real units tokenize, write and hash the bytes).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402
import orjson  # noqa: E402
from sim_meter import CAPTURED, Exchange, Meter, Paths, UnitRef, in_child, instrument, measured  # noqa: E402
from sim_today import Today  # noqa: E402
from sim_workload import RecordedWorkload  # noqa: E402

from shardsmith.core.input_file import InputFile  # noqa: E402
from shardsmith.engine.output.outdir import work_path  # noqa: E402
from shardsmith.engine.shuffle.partfile import read_footer  # noqa: E402
from shardsmith.kit.keys import ORDER_RECORD_BITS  # noqa: E402
from shardsmith.kit.reader import Task  # noqa: E402

# what must be equal per unit kind (``sim_meter.COUNTS`` and ``punches``); "written": bytes_written
# + holes_written, "meta_read": bytes_read - payload_read
COMPARED = {"scatter": ("opens", "part_opens", "written"),
            "plan": ("opens", "part_opens", "meta_read", "written"),
            "gather": ("opens", "part_opens", "meta_read", "payload_read", "written", "punches"),
            "finalize": ("opens", "part_opens", "meta_read", "written")}
WORDS = ["the", "of", "and", "to", "in", "is", "was", "for", "on", "that", "with", "as", "by", "at", "from", "his", "her", "it", "an", "are", "were", "this", "which", "be", "or", "shard", "token", "shuffle", "seed", "record", "gather", "scatter", "bucket", "part", "footer", "plan", "rank", "unit"]


def make_corpus(folder: Path, *, nbytes: int, files: int, seed: int) -> tuple[Path, Path]:
    """``files`` JSONL files of about ``nbytes`` in all (documents of lognormal length, as in
    ``corpus.py``), and a byte-level BPE (each byte a token: cheap to train, uint16 ids)."""
    from shardsmith.text.tokenize import train_bpe

    rng = np.random.default_rng(seed)
    root = folder / "corpus"
    root.mkdir(parents=True, exist_ok=True)
    vocab = np.array(WORDS)
    for f in range(files):
        lines, size = [], 0
        while size < nbytes // files:
            n = int(np.clip(rng.lognormal(np.log(60), 0.8), 5, 600))
            line = json.dumps({"text": " ".join(vocab[rng.integers(0, len(vocab), n)].tolist())}) + "\n"
            lines.append(line)
            size += len(line)
        (root / f"part-{f:02d}.jsonl").write_text("".join(lines))
    tokenizer = folder / "bytes.json"
    tokenizer.write_text(train_bpe(WORDS, vocab_size=258))
    return root, tokenizer


def preload() -> None:
    """What every stage of pack-tokens imports, imported once here: the forked stages inherit it
    (each would otherwise compile it again: ~0.4 s a process where bytecode is not cached)."""
    import shardsmith.cli
    import shardsmith.commands.pack_tokens  # noqa: F401
    from shardsmith import registry

    registry.loaded("source")
    registry.format_named("tokens")


def real_unit(argv: list[str], scratch: Path) -> dict[str, Any]:
    """One stage of the real command in this (forked) process, measured around ``convert_units``;
    what the command prints is kept from the terminal."""
    from shardsmith.cli import main
    from shardsmith.engine import conduct
    from shardsmith.engine.units import ScatterUnit

    report: dict[str, Any] = {}
    convert_units = conduct.convert_units

    def measured_unit(unit: Any, **kwargs: Any) -> Any:
        meter = Meter(scratch)
        instrument(meter)
        with meter.phase("scatter" if isinstance(unit, ScatterUnit) else "tables"):
            out = convert_units(unit, **kwargs)
        report.update(meter.report(), punches=CAPTURED.punches)
        return out

    conduct.convert_units = measured_unit  # type: ignore[assignment]
    with contextlib.redirect_stdout(io.StringIO()):
        main.main(args=argv, standalone_mode=False)
    return report


def snapshot(scratch: Path) -> dict[int, str]:
    """Each part file's bytes but its payloads (heads, footer, trailer), as a digest per task."""
    out = {}
    for path in sorted(scratch.glob("part-*.bin")):
        footer, rows = read_footer(path, rows=True)
        digest = hashlib.sha256()
        with open(path, "rb") as fh:
            for offset, count in zip(rows["offset"].tolist(), rows["count"].tolist()):
                fh.seek(offset)
                digest.update(fh.read(24 * count))
            fh.seek(footer.layout.index_at)
            digest.update(fh.read())  # the footer: index, directory, meta, trailer
        out[int(footer.meta["task"])] = digest.hexdigest()
    return out


def recorded(scratch: Path, corpus: Path, *, memory: int, ranks: int, shard_tokens: int, seed: int
             ) -> RecordedWorkload:
    """The real scatter's documents, tasks and metas, read back from its part files and its plan."""
    rows = orjson.loads(next(scratch.glob("tasks-*.json")).read_bytes())
    metas, docs = {}, {}
    for path in sorted(scratch.glob("part-*.bin")):
        footer, index = read_footer(path, rows=True)
        meta = footer.meta
        records, lengths = [], []
        with open(path, "rb") as fh:
            for offset, count in zip(index["offset"].tolist(), index["count"].tolist()):
                fh.seek(offset)
                heads = np.frombuffer(fh.read(24 * count), dtype=np.uint64).reshape(3, count)
                records.append((heads[1] & np.uint64((1 << ORDER_RECORD_BITS) - 1)).astype(np.int64))
                lengths.append(heads[2].astype(np.int64))
        rec, ln = (np.concatenate(records), np.concatenate(lengths)) if records else (np.zeros(0, np.int64),) * 2
        order = np.argsort(rec, kind="stable")
        metas[int(meta["task"])], docs[int(meta["task"])] = meta, (rec[order], ln[order])
    rel_of = {file_index: metas[task]["plan"][0] for task, file_index, *_ in rows}  # (plan: [rel, start, ...])
    files = {i: InputFile(path=str(corpus / rel), rel=rel, index=i, size=(corpus / rel).stat().st_size)
             for i, rel in rel_of.items()}
    tasks = tuple(Task(index=i, file=files[f], start=a, stop=b, first_record=r, nbytes=n)
                  for i, f, a, b, r, n, _ in rows)
    identity = tuple(orjson.loads((scratch / "run.json").read_bytes()).items())
    return RecordedWorkload(recorded_identity=identity, input_bytes=sum(f.size for f in files.values()), ranks=ranks, memory=memory,
                            shard_tokens=shard_tokens, seed=seed, recorded_files=tuple(files[i] for i in sorted(files)),
                            recorded_tasks=tasks, docs=docs, metas=metas)


def value(unit: dict[str, Any], key: str) -> float:
    """A compared figure of a unit (its phases added up)."""
    total = {k: sum(p[k] for p in unit["phases"].values()) for k in next(iter(unit["phases"].values()))}
    if key == "written":
        return total["bytes_written"] + total["holes_written"]
    if key == "meta_read":
        return total["bytes_read"] - total["payload_read"]
    if key == "punches":
        return unit["punches"] if "punches" in unit else unit["counted"]["punch_pairs"]
    return total[key]


@dataclass
class RealRun:
    """A real staged run, measured: its units, its documents read back, its part files' digests."""

    units: list[dict[str, Any]]
    workload: RecordedWorkload
    parts: dict[int, str]


def real_run(root: Path, *, nbytes: int, ranks: int, files: int, memory: int, shard_tokens: int, seed: int
             ) -> RealRun:
    """``pack-tokens`` on a corpus made in ``root``, every stage a process of its own, measured."""
    preload()
    corpus, tokenizer = make_corpus(root, nbytes=nbytes, files=files, seed=seed)
    out = root / "real"
    scratch = work_path(out)
    base = ["pack-tokens", str(corpus), "--tokenizer", str(tokenizer), "-o", str(out), "--memory", str(memory),
            "--shard-tokens", str(shard_tokens), "--seed", str(seed), "--workers", "1", "-q",
            "--world-size", str(ranks)]

    def unit(stage: str, rank: int | None) -> dict[str, Any]:
        argv = [*base, "--stage", stage, *([] if rank is None else ["--rank", str(rank)])]
        return {"unit": stage if rank is None else f"{stage} {rank}", "kind": stage, **in_child(real_unit, argv, scratch)}

    units = [unit("scatter", r) for r in range(ranks)]
    wl = recorded(scratch, corpus, memory=memory, ranks=ranks, shard_tokens=shard_tokens, seed=seed)
    parts = snapshot(scratch)  # before the gather punches the heads out
    units.append(unit("plan", None))
    units += [unit("gather", r) for r in range(ranks)]
    units.append(unit("finalize", None))
    if not (out / "manifest.json").is_file():
        raise RuntimeError("the real run wrote no manifest")
    return RealRun(units=units, workload=wl, parts=parts)


def simulated(real: RealRun, root: Path, *, exchange: Exchange | None = None) -> dict[str, Any]:
    """The simulation of ``real``'s run by ``exchange`` (today's: every head written), every unit of
    it (its ``setup_units``, then every gather rank, then finalize), compared with the real unit of
    the same name; a unit that only one side has fails the check."""
    wl = real.workload
    ex = exchange or Today(heads="all")
    out = Path(tempfile.mkdtemp(prefix=f"sim-{ex.name}-", dir=root)) / "out"
    paths = Paths(out=out, scratch=work_path(out))
    out.mkdir()
    prepared = in_child(lambda: ex.prepare(wl, sample=wl.ranks))
    setup = ex.setup_units(wl)
    order = [*setup, *(u for u in (UnitRef("gather", r) for r in range(wl.ranks)) if u not in setup),
             UnitRef("finalize")]
    sim, sim_parts = [], {}
    for k, unit in enumerate(order):
        sim.append(measured(ex, wl, paths, unit, prepared))
        if unit.kind == "scatter" and (k + 1 == len(order) or order[k + 1].kind != "scatter"):
            sim_parts = snapshot(paths.scratch)  # before any gather unit gives spill back
    mine = {u["unit"]: u for u in sim}
    units = []
    for a in real.units:
        keys = COMPARED[a["kind"]]
        b = mine.pop(a["unit"], None)
        units.append({"unit": a["unit"], "real": {k: value(a, k) for k in keys},
                      "sim": None if b is None else {k: value(b, k) for k in keys}})
    units += [{"unit": name, "real": None, "sim": {}} for name in mine]  # a unit the real run does not have
    # the counts the totals use for the gather ranks a large run does not measure: its opens of part
    # files while it reads (each once a range, punched through the same descriptors), from the engine's
    # tables and plan, against what the unit measured
    counted = [{"unit": u["unit"], "measured": u["phases"]["read"]["part_opens"],
                "counted": u["counted"]["read_pairs"]}
               for u in sim if u["kind"] == "gather" and "read" in u["phases"] and "read_pairs" in u["counted"]]
    parts_equal = real.parts == sim_parts and len(sim_parts) == wl.task_count
    ok = parts_equal and all(u["real"] == u["sim"] for u in units) and all(c["measured"] == c["counted"] for c in counted)
    return {"units": units, "counted": counted, "parts_equal": parts_equal, "parts": len(sim_parts), "ok": ok,
            "workload": {"input_bytes": wl.input_bytes, "ranks": wl.ranks, "memory": wl.memory,
                         "shard_tokens": wl.shard_tokens, "tasks": wl.task_count, "buckets": wl.buckets}}


def check(*, nbytes: int = 1_000_000, ranks: int = 2, files: int = 2, memory: int = 2_000_000,
          shard_tokens: int = 250_000, seed: int = 0, workdir: Path | None = None) -> dict[str, Any]:
    """The real run and the simulation of it, unit by unit: ``{"units": [...], "parts_equal": bool,
    "ok": bool}``; each unit ``{"unit", "real": {...}, "sim": {...}}`` of the ``COMPARED`` figures."""
    root = Path(tempfile.mkdtemp(prefix="sim-check-", dir=workdir))
    try:
        real = real_run(root, nbytes=nbytes, ranks=ranks, files=files, memory=memory, shard_tokens=shard_tokens,
                        seed=seed)
        return simulated(real, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def print_check(got: dict[str, Any]) -> None:
    w = got["workload"]
    print(f"self-check: a real pack-tokens run ({w['input_bytes'] / 1e6:.1f} MB of JSONL, --memory "
          f"{w['memory'] / 1e6:g}MB, --shard-tokens {w['shard_tokens']:,}, {w['ranks']} ranks: {w['tasks']} part "
          f"files, {w['buckets']} buckets; each unit a process) against its simulation, unit by unit")
    print(f"  part files, byte for byte but the payloads: {'equal' if got['parts_equal'] else 'DIFFERENT'} "
          f"({got['parts']})")
    for u in got["units"]:
        if u["real"] is None or u["sim"] is None:
            print(f"  {u['unit']:<10} DIFFERENT only the {'simulation' if u['real'] is None else 'real run'} has it")
            continue
        cells = ", ".join(f"{k} {u['real'][k]:,.0f}" + ("" if u["real"][k] == u["sim"][k] else f" (sim {u['sim'][k]:,.0f})")
                          for k in u["real"])
        print(f"  {u['unit']:<10} {'equal' if u['real'] == u['sim'] else 'DIFFERENT':<9} {cells}")
    for c in got["counted"]:
        same = c["measured"] == c["counted"]
        print(f"  {c['unit']:<10} {'equal' if same else 'DIFFERENT':<9} simulated, its opens of part files while it "
              f"reads {c['measured']:,.0f}; counted from the engine's tables and plan {c['counted']:,.0f}")
    print(f"  self-check {'passed' if got['ok'] else 'FAILED'}: the simulation counts what the real units do"
          if got["ok"] else "  self-check FAILED: the simulation's counts differ from the real run's")
    print()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=1.0, help="JSONL to make, MB")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--memory", default=2_000_000, type=int, help="pack-tokens --memory, bytes")
    ap.add_argument("--shard-tokens", type=int, default=250_000)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    got = check(nbytes=int(args.mb * 1e6), ranks=args.ranks, memory=args.memory, shard_tokens=args.shard_tokens)
    print_check(got)
    if args.json is not None:
        args.json.write_bytes(orjson.dumps(got, option=orjson.OPT_INDENT_2))
    return 0 if got["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
