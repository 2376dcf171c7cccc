"""The kinds of sample of token datasets (``kit/sample_kind.py``): what windows, documents and packed
sequences share to be mixed (the tokenizer that made the ids), and how windows are gathered."""

from __future__ import annotations

from typing import Any

import numpy as np

from shardsmith.kit.sample_kind import ArraysForm, Groups


class WindowsForm(ArraysForm):
    """Token windows' batches, ``(x, y)``: windows of datasets of one dtype are gathered straight
    into one batch (``fill_windows`` of each, then one ``split_windows``), as a mixture reads them."""

    name = "token windows"

    def gather(self, groups: Groups, n: int) -> tuple[np.ndarray, np.ndarray]:
        first = groups[0][0]
        if len({ds.dtype for ds, _, _ in groups}) > 1:
            return super().gather(groups, n)
        out = np.empty((n, first.seq_len + 1), first.dtype)
        for ds, indices, rows in groups:
            ds.fill_windows(indices, out, rows)
        return first.split_windows(out)


def tokenizer_of(manifest: dict[str, Any]) -> str | None:
    """The sha256 of the tokenizer that made a dataset's ids (samples of two tokenizers do not mix)."""
    tokenizer = manifest.get("tokenizer")
    return tokenizer.get("sha256") if isinstance(tokenizer, dict) else None
