"""Whether a finished dataset is still what its run wrote: only then is the same command "already complete".

Running the exact command of a finished run again does nothing (``outdir.prepare_output``,
``outremote.claim_prefix``), like ``make`` with a target that is up to date. That holds only while
the output still holds what the run wrote: every file the manifest lists is there, of the size it
lists, and (in a folder) none was written after the manifest, the run's last file. Sizes and times,
not hashes, so a rerun answers at once however large the dataset; ``shardsmith verify`` hashes
every byte.
"""

from __future__ import annotations

import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

from shardsmith import registry
from shardsmith.core.manifest import MANIFEST, resolve_inside
from shardsmith.errors import DatasetError
from shardsmith.kit import manifest_io
from shardsmith.kit.format import manifest_files


def changes(out: Path) -> list[str]:
    """What differs in the dataset folder ``out`` from its manifest, a short phrase each (empty: intact)."""
    try:
        manifest = manifest_io.load(out)
        written = (Path(out) / MANIFEST).stat().st_mtime_ns
    except (DatasetError, OSError) as exc:
        return [f"its {MANIFEST} cannot be read ({exc})"]
    found = []
    for entry in manifest_files(manifest, registry.format_of(manifest)):
        rel = entry["path"]
        try:
            st = resolve_inside(out, rel).stat()
        except DatasetError:
            found.append(f"{rel} leads outside the folder")
            continue
        except OSError:
            found.append(f"{rel} is missing")
            continue
        if not stat.S_ISREG(st.st_mode):
            found.append(f"{rel} is not a file")
        elif st.st_size != entry["bytes"]:
            found.append(_size_differs(rel, st.st_size, entry["bytes"]))
        elif st.st_mtime_ns > written:
            found.append(f"{rel} was modified after the manifest was written")
    return found


def listing_changes(manifest: bytes | None, sizes: Mapping[str, Any]) -> list[str]:
    """The same for a dataset at a prefix: ``manifest``'s bytes against the objects listed there
    (name -> ``ObjectInfo``, whose ``size`` is compared)."""
    try:
        m = orjson.loads(manifest or b"")
        entries = manifest_files(m, registry.format_of(m))
    except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError, DatasetError):
        return [f"its {MANIFEST} cannot be read"]
    found = []
    for entry in entries:
        rel, info = entry["path"], sizes.get(entry["path"])
        if info is None:
            found.append(f"{rel} is missing")
        elif info.size != entry["bytes"]:
            found.append(_size_differs(rel, info.size, entry["bytes"]))
    return found


def refusal(where: str, changed: list[str]) -> str:
    """The one line that refuses to call the same command's changed dataset complete."""
    more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
    return (f"{where}: holds the dataset this same command finished, but it changed since "
            f"({'; '.join(changed[:3])}{more}); pass --overwrite to make it again")


def _size_differs(rel: str, size: int, listed: int) -> str:
    return f"{rel} is {size:,} bytes, the manifest says {listed:,}"
