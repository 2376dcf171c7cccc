"""What the torch adapters say when torch is not installed, worded once for the three modules that import it
(``shardsmith.torch``, ``torch_feed``, ``torch_images``): one line naming the ``torch`` extra, instead of Python's
bare "No module named 'torch'", which does not say how shardsmith wants it installed."""

from __future__ import annotations

from shardsmith.errors import install_hint


def torch_missing(module: str) -> ModuleNotFoundError:
    """The error ``module`` raises (``from None``: the line is the whole story) when ``import torch`` fails; a
    ``ModuleNotFoundError`` naming torch, so code that catches the bare one still catches it."""
    return ModuleNotFoundError(f"{module} needs torch, which is not installed: {install_hint('torch')}", name="torch")
