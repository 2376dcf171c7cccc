"""Whether a finished dataset is still what its run wrote: only then is the same command "already complete".

Running the exact command of a finished run again does nothing (``outdir.prepare_output``), like
``make`` with a target that is up to date. That holds only while the folder still holds what the
run wrote: every file the manifest lists is there, of the size it lists, and none was written after
the manifest (the run's last file). Sizes and times, not hashes, so a rerun answers at once however
large the dataset; ``shardsmith verify`` hashes every byte.
"""

from __future__ import annotations

import stat
from pathlib import Path

from shardsmith.core.manifest import MANIFEST, resolve_inside
from shardsmith.errors import DatasetError
from shardsmith.kit import manifest_io
from shardsmith.kit.writer import manifest_files


def changes(out: Path) -> list[str]:
    """What differs in the dataset folder ``out`` from its manifest, a short phrase each (empty: intact)."""
    try:
        manifest = manifest_io.load(out)
        written = (Path(out) / MANIFEST).stat().st_mtime_ns
    except (DatasetError, OSError) as exc:
        return [f"its {MANIFEST} cannot be read ({exc})"]
    found = []
    for entry in manifest_files(manifest):
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
            found.append(f"{rel} is {st.st_size:,} bytes, the manifest says {entry['bytes']:,}")
        elif st.st_mtime_ns > written:
            found.append(f"{rel} was modified after the manifest was written")
    return found
