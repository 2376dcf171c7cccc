"""``verify`` of a Lance output without reading its rows: each shard's file footer (its row count
against the manifest's) and, for a local folder, the split's table as pylance opens it (its rows,
its fragments one per shard, in order)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shardsmith.formats.lance.names import quiet_lance


def layout_problems(ds: Any, out: Any, manifest: dict[str, Any], split: str) -> list[str]:
    quiet_lance()
    import lance

    problems: list[str] = ds.footer_problems()
    record = manifest["splits"][split].get("lance") or {}
    if problems or not isinstance(out, str | Path) or not record.get("dataset"):
        return problems  # a dataset at a URL: its table's files are checked by their digests alone
    root = Path(out) / record["dataset"]
    try:
        table = lance.dataset(str(root))
        rows = table.count_rows()
        files = [[f.path for f in frag.metadata.files] for frag in table.get_fragments()]
    except Exception as exc:  # pylance's errors for a table it cannot read
        return [f"{record['dataset']}: pylance cannot open the table ({str(exc).splitlines()[0]})"]
    expected = [[s["path"].rsplit("/", 1)[-1]] for s in ds.shards]
    if rows != len(ds) or files != expected:
        problems.append(f"{record['dataset']}: pylance reads {rows} rows in {len(files)} fragments, the manifest "
                        f"says {len(ds)} in {len(expected)}")
    return problems
