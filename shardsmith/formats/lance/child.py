"""The process that writes a writer's Lance data files: pylance is not fork-safe (a process forked
from one whose pylance has started its runtime crashes when it uses it: a test suite, a notebook,
a program that opened a Lance dataset before it converts), and the workers are forked. So each
writer starts this one, a fresh interpreter, with its first samples (pylance loads while the first
shard's rows are typed), and hands it its shards one after another, each an Arrow IPC stream
through a FIFO, written as pylance reads it; it answers each with the fragment pylance wrote, as
one JSON line.

Request (a JSON line on stdin): ``{"arrow": FIFO, "into": FOLDER, "version": "2.1"}``; answer:
``{"path", "fields", "columns", "major", "minor"}`` or ``{"error": "..."}``. It ends when its stdin does
(its writer closed it, or died)."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from typing import Any

# no limit of Lance's own on a file: the shard's rollover cuts (pylance 14, given a row limit past
# int32's, e.g. 1 << 40, wrote a file per batch it was handed: it overflows)
MAX_ROWS = (1 << 31) - 1
MAX_BYTES = 1 << 40


def write(request: dict[str, Any]) -> dict[str, Any]:
    import pyarrow as pa
    from lance.fragment import write_fragments

    # a FIFO, which the writer writes the rows into as this reads them (read through Python: Arrow's
    # own files seek, which a FIFO cannot)
    with open(request["arrow"], "rb") as source:
        reader = pa.ipc.open_stream(pa.PythonFile(source, mode="r"))
        fragments = write_fragments(reader, request["into"], data_storage_version=request["version"],
                                    max_rows_per_file=MAX_ROWS, max_bytes_per_file=MAX_BYTES, mode="create")
    if len(fragments) != 1 or len(fragments[0].files) != 1:
        return {"error": f"pylance wrote {len(fragments)} fragments, not one file"}
    data = fragments[0].files[0]
    return {"path": data.path, "fields": list(data.fields), "columns": list(data.column_indices),
            "major": data.file_major_version, "minor": data.file_minor_version}


def main() -> None:
    os.environ.setdefault("LANCE_LOG", "error")
    with contextlib.suppress(Exception):  # (a pylance that cannot load says why in its answer to the first request)
        import lance.fragment  # noqa: F401 (loaded before the first request comes: the writer starts this early)

    for line in sys.stdin:
        try:
            answer = write(json.loads(line))
        except Exception as exc:  # pylance's and pyarrow's errors, for the writer to report in one line
            answer = {"error": str(exc).splitlines()[0] if str(exc) else type(exc).__name__}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
