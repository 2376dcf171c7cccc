"""Document origins of a tokens dataset made with ``pack-tokens --provenance``.

Beside each shard, ``{shard}.origins.npy`` holds one ``kit.doc_origin.DOC_ORIGIN`` row per
document of the shard (per document piece of a packed shard, as its ``.cu.npy`` lists them), in
the order they are in the shard: which input (an index into the manifest's ``source.inputs``),
which record, the byte offset of its line (plain JSONL, else -1) and a 32-bit hash of its text.
The manifest lists it in the shard's record (``origins``: path, bytes, sha256), so ``verify``
hashes it; the loader reads it only for ``sources(i)``, never to serve tokens.

How the rows come: the gather hands the writer each batch's rows (``SortedBatch.origins``, from the
scatter's ``Reader.record_offsets`` and text hashes), and ``packing.Window`` carries each document's
row to its pieces; a batch without them is an assertion, never a partial sidecar. The manifest's
``source`` then lists every input with ``input_sizes``, ``input_units`` and ``input_dir`` (local
inputs). The bytes follow the documents' order, so the same-bytes guarantee holds. ``verify`` hashes
the sidecars and checks their rows (``verify_layout``); ``TokenDataset.sources(i)`` /
``PackedSequences.sources(i)`` read them (inside the folder, as every sidecar) only when asked;
``shardsmith trace`` (``commands/trace.py``) reads the inputs again, and its ``--state`` follows a
saved loader state with ``global_position`` to the next batch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from shardsmith.core.fsutil import HashingFile
from shardsmith.core.npy import npy_bytes, read_npy
from shardsmith.errors import DatasetError
from shardsmith.formats.tokens.boundaries import read_boundaries
from shardsmith.kit.doc_origin import DOC_ORIGIN

ORIGINS_SUFFIX = ".origins.npy"


def check_batch(origins: np.ndarray | None, documents: int) -> np.ndarray:
    """A batch's origins as a writer with ``--provenance`` must get them: one row per document.
    Anything else is a bug upstream, never a partial sidecar."""
    assert origins is not None, "--provenance: the gather handed the writer a batch without its documents' origins"
    assert origins.dtype == DOC_ORIGIN and len(origins) == documents, \
        f"--provenance: {len(origins)} origin rows ({origins.dtype}) for {documents} documents"
    return origins


def write_origins(path: Path, parts: list[np.ndarray]) -> dict[str, Any]:
    """The sidecar of one shard, written whole (temporary name, fsynced, hashed, renamed): its entry."""
    rows = np.concatenate(parts) if parts else np.zeros(0, DOC_ORIGIN)
    f = HashingFile(path)
    f.write(npy_bytes(rows))
    return {"path": f.path.name, "bytes": f.bytes, "sha256": f.commit()}


def load_origins(files: Any, entries: list[dict[str, Any]], counts: list[int], *, where: Any) -> np.ndarray:
    """Every shard's origin rows, checked (dtype, one row per document or piece: ``counts``), joined
    in split order. ``files``: the dataset's files (``kit.dataset_files``), which read only inside it."""
    parts = []
    for entry, want in zip(entries, counts):
        side = entry.get("origins")
        if not isinstance(side, dict):
            raise DatasetError(f"{where}: made without --provenance: its shards record no document origins "
                               f"(pack-tokens --provenance writes them)")
        name = files.name_of(side["path"])
        try:
            data = files.sidecar(side)
        except OSError as exc:
            raise DatasetError(f"{name}: cannot read the document origins ({exc.strerror or exc})") from None
        rows = read_npy(data, where=f"{name}: document origins", dtype=DOC_ORIGIN, ndim=1)
        if len(rows) != want:
            raise DatasetError(f"{name}: {len(rows)} origin rows, the shard holds {want} documents")
        parts.append(rows)
    return np.concatenate(parts) if parts else np.zeros(0, DOC_ORIGIN)


def has_origins(manifest: dict[str, Any]) -> bool:
    """Whether the dataset was made with ``--provenance`` (any shard names its origins)."""
    return any("origins" in shard for split in manifest["splits"].values() for shard in split["shards"])


def verify_origins(out: Any, manifest: dict[str, Any], split: str) -> list[str]:
    """``verify``: each shard of ``split`` has its origins (hashed already, with the other files),
    one ``DOC_ORIGIN`` row per document (per piece of a packed shard, as its boundaries list them),
    each naming one of the manifest's inputs."""
    from shardsmith.kit.dataset_files import files_for  # the readers' side: not imported by the writer

    files = files_for(out)
    inputs = manifest["source"].get("inputs")
    problems = []
    if not isinstance(inputs, list):
        problems.append("the manifest's source.inputs is not the list of inputs the origins index")
    for shard in manifest["splits"][split]["shards"]:
        try:
            want = int(shard["samples"])
            if isinstance(shard.get("boundaries"), dict):  # packed: a row per document piece
                want = len(read_boundaries(files, shard["boundaries"], tokens=shard.get("tokens")))
            rows = load_origins(files, [shard], [want], where=shard["path"])
        except (DatasetError, OSError, ValueError) as exc:
            problems.append(str(exc))
            continue
        if isinstance(inputs, list) and len(rows) and int(rows["file"].max()) >= len(inputs):
            problems.append(f"{shard['origins']['path']}: a document's input {int(rows['file'].max())} is not one "
                            f"of the manifest's {len(inputs)} inputs")
    return problems


def described(rows: np.ndarray, spans: list[tuple[int, int]], manifest: dict[str, Any], *,
              where: Any) -> list[dict[str, Any]]:
    """One dict per document: its input's path, its record named by the input's unit (1-based, as
    errors name it: ``line``, ``row``) and 0-based (``record``), the byte offset of its line (None
    where unknown), its text hash, and its token span ``[start, stop)`` inside the sample."""
    source = manifest.get("source") or {}
    inputs, units = source.get("inputs"), source.get("input_units")
    if not isinstance(inputs, list):
        raise DatasetError(f"{where}: the manifest does not name its inputs (made without --provenance?)")
    out = []
    for row, (start, stop) in zip(rows, spans):
        f, record, offset = int(row["file"]), int(row["record"]), int(row["offset"])
        if f >= len(inputs):
            raise DatasetError(f"{where}: a document's input {f} is not one of the manifest's {len(inputs)} inputs")
        unit = units[f] if isinstance(units, list) and f < len(units) and isinstance(units[f], str) else "record"
        doc = {"input": inputs[f], "file": f, unit: record + 1, "record": record,
               "offset": offset if offset >= 0 else None, "hash": int(row["hash"]), "start": start, "stop": stop}
        out.append(doc)  # a unit named "record" is the 0-based number: "record" always is
    return out
