"""What the dataset card says of HDF5 event shards: ``datasets``' ``hdf5`` builder reads datasets
of one row per event, so the card names the fixed-shape fields (the builder reads only the fields
the features name); ragged fields (values plus offsets) are not rows, and only shardsmith reads them."""

from __future__ import annotations

from typing import Any

import numpy as np

from shardsmith.kit.format import CardData

_ARRAYS = {2: "array2_d", 3: "array3_d", 4: "array4_d", 5: "array5_d"}  # datasets' ArrayND in YAML


def hdf5_card(manifest: dict[str, Any]) -> CardData:
    schema = manifest.get("schema") or {}
    features, left = [], []
    for name, spec in schema.items():
        feature = None if spec.get("ragged") else fixed_feature(name, spec)
        if feature is None:
            left.append(name)
        else:
            features.append(feature)
    notes = []
    if left:
        notes.append(f"`datasets` reads the fixed-shape fields only; {', '.join(f'`{n}`' for n in left)} "
                     f"(ragged: values and offsets per event, or a type it has no feature for) are read by "
                     f"shardsmith's loader.")
    if str((manifest.get("hdf5") or {}).get("compression", "")).startswith("blosc"):
        notes.append("The shards are blosc-compressed: `import hdf5plugin` before `load_dataset` (it registers "
                     "the filter with HDF5).")
    if not features:
        return CardData(notes=tuple(notes))
    return CardData(builder="hdf5", pattern="{split}-*.h5", features=features, notes=tuple(notes))


def fixed_feature(name: str, spec: dict[str, Any]) -> dict[str, Any] | None:
    """A fixed field's feature in the YAML of ``datasets`` (None: a dtype it has no value for)."""
    try:
        dt = np.dtype(spec["dtype"])
    except (TypeError, ValueError, KeyError):
        return None
    if dt.kind == "b":
        value = "bool"
    elif dt.kind in "iu" and dt.itemsize in (1, 2, 4, 8):
        value = f"{'u' if dt.kind == 'u' else ''}int{8 * dt.itemsize}"
    elif dt.kind == "f" and dt.itemsize in (2, 4, 8):
        value = f"float{8 * dt.itemsize}"
    else:
        return None
    shape = [int(d) for d in spec.get("shape") or []]
    if any(d <= 0 for d in shape) or len(shape) > 5:
        return None
    if not shape:
        return {"name": name, "dtype": value}
    if len(shape) == 1:
        return {"name": name, "list": value, "length": shape[0]}
    return {"name": name, "dtype": {_ARRAYS[len(shape)]: {"shape": shape, "dtype": value}}}
