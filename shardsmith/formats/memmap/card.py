"""What the dataset card says of memmap arrays: HuggingFace ``datasets`` has no builder for raw
``.bin`` arrays, so the card shows the plain ``np.memmap`` recipe (the one the arrays are made for)
and tells ``load_dataset`` so in a sentence (``CardData.unreadable``)."""

from __future__ import annotations

from typing import Any

from shardsmith.kit.format import CardData


def memmap_card(manifest: dict[str, Any]) -> CardData:
    split = next(iter(manifest["splits"]), "train")
    recipe = "\n".join([
        "With numpy alone (`np.memmap`; no shardsmith needed), from this folder:", "",
        "```python",
        "import json",
        "from pathlib import Path",
        "",
        "import numpy as np",
        "",
        f'meta = json.loads(Path("{split}.memmap.json").read_text())',
        'v = meta["values"]  # path, dtype, shape [N, L, F], fields',
        'values = np.memmap(v["path"], dtype=v["dtype"], mode="r", shape=tuple(v["shape"]))',
        'lengths = np.fromfile(meta["lengths"]["path"], dtype=meta["lengths"]["dtype"])  # values stored per event',
        'mask = np.arange(meta["max_len"]) < lengths[:, None]  # (N, L): True where a row holds data',
        "```"])
    return CardData(notes=(recipe,), unreadable="memmap arrays are read with np.memmap or shardsmith.open, not "
                                                 "HuggingFace datasets - see README.md")
