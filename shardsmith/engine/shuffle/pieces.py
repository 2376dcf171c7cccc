"""A gather's *pieces*: the record each writer leaves of the shards it wrote (scratch folder,
``piece-{split}-{first}-{stop}.json``), whether a piece's files are still intact, and the chain of
pieces that covers a split's shards once each (ranks of reruns with other world sizes may leave
overlapping ones). Plain files, so ranks on different machines share them; ``engine/shuffle/gather.py``
writes them and finishes splits from them, after a writer rewrote the shards that depend on every
split's (``rejoin``: their new records replace the old in their pieces)."""

from __future__ import annotations

import os
from glob import escape as glob_escape
from pathlib import Path
from typing import Any

import orjson

from shardsmith.core.faults import crash_point
from shardsmith.core.fsutil import atomic_write_bytes
from shardsmith.errors import DatasetError, UsageError
from shardsmith.kit.writer import ShardRecord, Writer, piece_files, piece_stretches


def piece_path(work_dir: Path, split: str, first: int, stop: int) -> Path:
    return work_dir / f"piece-{split}-{first:06d}-{stop:06d}.json"


def _read(work_dir: Path, split: str) -> list[dict[str, Any]]:
    out = []
    for path in sorted(work_dir.glob(f"piece-{split}-*.json")):
        try:
            out.append(orjson.loads(path.read_bytes()))
        except (OSError, ValueError):
            continue  # torn: its range is missing, and finishing says so
    return out


def is_intact(piece: dict[str, Any], out_dir: Path, work_dir: Path) -> bool:
    """Whether every file a piece vouches for is still there, with its size, and every stretch of a
    split-wide file it wrote reaches its end (in the scratch file, or in the output file it was
    moved to: ``kit/writer.py``)."""
    for entry in piece_files(piece):
        try:
            if os.path.getsize(out_dir / entry["path"]) != int(entry["bytes"]):
                return False
        except OSError:
            return False
    for stretch in piece_stretches(piece):
        sizes = [os.path.getsize(p) for p in (work_dir / stretch["scratch"], out_dir / stretch["path"]) if p.is_file()]
        if not sizes or max(sizes) < int(stretch["end"]):
            return False
    return True


def piece_state(work_dir: Path, out_dir: Path, split: str, first: int, stop: int) -> bool | None:
    """None where shards ``[first, stop)`` have no piece; else whether every file it names is intact
    (an unreadable piece is not)."""
    path = piece_path(work_dir, split, first, stop)
    if not path.is_file():
        return None
    try:
        return is_intact(orjson.loads(path.read_bytes()), out_dir, work_dir)
    except (OSError, ValueError):
        return False


def piece_intact(work_dir: Path, out_dir: Path, split: str, first: int, stop: int) -> bool:
    """Whether shards ``[first, stop)`` have their piece, every file of it intact (a killed run of the
    same command finished the range: a rerun leaves it as it is)."""
    return bool(piece_state(work_dir, out_dir, split, first, stop))


def cover(split: str, samples: int, work_dir: Path, out_dir: Path) -> list[dict[str, Any]]:
    """Pieces that cover the split's shards once each, in order (ranks of different runs' world
    sizes may have left overlapping ones: their shards are the same)."""
    pieces = _read(work_dir, split)
    whole = [p for p in pieces if p.get("whole") and is_intact(p, out_dir, work_dir)]
    if whole:
        return whole[:1]
    plan_path = work_dir / f"plan-{split}.json"
    if not samples:
        shards = 0
    elif plan_path.is_file():
        shards = len(orjson.loads(plan_path.read_bytes())["bounds"]) - 1
    else:
        raise UsageError(f"split {split}: no shard is written yet: run the gather (--stage gather on every "
                         f"rank) first")
    ranged = [p for p in pieces if not p.get("whole")]
    chain = _chain(ranged, 0, shards, {})
    if chain is None:
        at = _reach(ranged, shards)
        later = sorted(int(p["first_shard"]) for p in ranged if int(p["first_shard"]) > at)
        upto = later[0] if later else shards
        raise UsageError(f"split {split}: shards {at}..{upto - 1} of {shards} are not written: run --stage "
                         f"gather on every rank first (rank r of W writes the r-th W-th of them)")
    for p in chain:
        if not is_intact(p, out_dir, work_dir):
            raise DatasetError(f"split {split}: a file of shards {p['first_shard']}..{int(p['stop']) - 1} is "
                               f"missing or changed in {out_dir}: rerun the gather rank that wrote them")
    return chain


def _chain(pieces: list[dict[str, Any]], at: int, shards: int, memo: dict[int, Any]) -> list[dict[str, Any]] | None:
    """Pieces back to back from shard ``at`` to ``shards`` (longest first; ranks of reruns with
    other world sizes may have left pieces that overlap), or None."""
    if at == shards:
        return []
    if at not in memo:
        memo[at] = None
        for p in sorted((p for p in pieces if int(p["first_shard"]) == at), key=lambda p: -int(p["stop"])):
            rest = _chain(pieces, int(p["stop"]), shards, memo) if int(p["stop"]) > at else None
            if rest is not None:
                memo[at] = [p, *rest]
                break
    return memo[at]


def _reach(pieces: list[dict[str, Any]], shards: int) -> int:
    """The furthest shard a chain of pieces from shard 0 reaches: where the gap starts (for the
    error message)."""
    reached, frontier = {0}, [0]
    while frontier:
        at = frontier.pop()
        for p in pieces:
            stop = int(p["stop"])
            if int(p["first_shard"]) == at and stop not in reached:
                reached.add(stop)
                frontier.append(stop)
    return max(r for r in reached if r < shards)


def rejoin(writer: Writer, chains: dict[str, list[dict[str, Any]]], work_dir: Path) -> None:
    """Let ``writer`` rewrite shards that depend on every split's (``Writer.join_shards``). Each new
    record replaces the shard's old one in ``chains`` and in the scratch folder before the new file
    takes the shard's name: a piece of several shards that names it is first cut into pieces of one
    shard each, and the shard's own piece then names the new file. A run killed in between finds that
    piece not intact (the old file is in place) and gathers the shard again, which writes its piece
    anew: no longer piece names the file as it is not (``cover`` takes the longest first)."""
    at: dict[tuple[str, int], tuple[dict[str, Any], int]] = {}
    records: dict[str, list[ShardRecord]] = {}
    for split, chain in chains.items():
        records[split] = []
        for piece in chain:
            for i, shard in enumerate(piece["shards"]):
                at[split, len(records[split])] = (piece, i)
                records[split].append(ShardRecord.from_json(shard))

    def replaced(split: str, k: int, record: ShardRecord) -> None:
        piece, i = at[split, k]
        first = int(piece["first_shard"]) + i
        was = {"old": piece["shards"][i], "old_md5": piece["md5s"][i], "new": record.to_json()}
        atomic_write_bytes(rejoined_path(work_dir, split, first), orjson.dumps(was))
        piece["shards"][i], piece["md5s"][i] = record.to_json(), None  # (the md5: the old file's bytes)
        _name(work_dir, split, first, piece["shards"][i], None)
        crash_point(f"rejoin:{split}:{k}")  # (the crash tests: the piece names the new file, the old is in place)

    writer.join_shards(records, replaced=replaced)


def rejoined_path(work_dir: Path, split: str, k: int) -> Path:
    """The record of shard ``k``'s rewrite by ``rejoin``: its old and its new record."""
    return work_dir / f"rejoined-{split}-{k:06d}.json"


def reconcile(work_dir: Path, out_dir: Path) -> None:
    """Each shard ``rejoin`` rewrote named by its piece as its file is now: the new record where the
    file has the new one's size, else the old (a cluster finalize killed while it uploaded the
    rewritten shards over their objects, rerun: some objects are new, some old; the old are rewritten
    again, to the same bytes). Where both sizes are equal the new record is named, and a file still
    old is rewritten again all the same (its schema is not the dataset's)."""
    for path in sorted(work_dir.glob("rejoined-*.json")):
        was = orjson.loads(path.read_bytes())
        split, k = path.stem[len("rejoined-"):].rsplit("-", 1)
        new = was["new"]
        try:
            now = os.path.getsize(out_dir / new["path"]) == int(new["bytes"])
        except OSError:
            now = False
        _name(work_dir, split, int(k), new if now else was["old"], None if now else was["old_md5"])


def _name(work_dir: Path, split: str, first: int, shard: dict[str, Any], md5: str | None) -> None:
    """Shard ``first`` of ``split`` named by a piece of its own with ``shard`` (its record); the
    pieces of several shards that name it cut first."""
    for path in [p for p in _read_paths(work_dir, split) if _names(p[1], first)]:
        _cut(work_dir, split, *path)
    one = {"first_shard": first, "shards": [shard], "md5s": [md5], "stop": first + 1, "whole": False}
    atomic_write_bytes(piece_path(work_dir, split, first, first + 1), orjson.dumps(one))


def _read_paths(work_dir: Path, split: str) -> list[tuple[Path, dict[str, Any]]]:
    out = []
    for path in sorted(work_dir.glob(f"piece-{glob_escape(split)}-*.json")):
        try:
            piece = orjson.loads(path.read_bytes())
        except (OSError, ValueError):
            continue  # torn: a rerun does not trust it either
        if path == piece_path(work_dir, split, int(piece["first_shard"]), int(piece["stop"])):
            out.append((path, piece))  # (not a longer split name's)
    return out


def _names(piece: dict[str, Any], k: int) -> bool:
    return int(piece["first_shard"]) <= k < int(piece["stop"])


def _cut(work_dir: Path, split: str, path: Path, piece: dict[str, Any]) -> None:
    """A piece of several shards as pieces of one shard each (written before it is removed), when
    it vouches for nothing beside its shards (a split-wide file's part stays in it)."""
    first, shards = int(piece["first_shard"]), piece.get("shards") or []
    if len(shards) < 2 or piece.get("files") or piece.get("stretches"):
        return
    for j, (shard, md5) in enumerate(zip(shards, piece["md5s"])):
        one = {"first_shard": first + j, "shards": [shard], "md5s": [md5], "stop": first + j + 1, "whole": False}
        atomic_write_bytes(piece_path(work_dir, split, first + j, first + j + 1), orjson.dumps(one))
    path.unlink(missing_ok=True)
