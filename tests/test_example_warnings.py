"""Our examples print no warning of ours: a loop over our adapters runs under `-W error`,
and `make demo` (examples/demo.py, with every command it runs) under every warning as an error.

Two warnings used to reach users of the README's loops: torchdata 0.11's call of the deprecated
`torch.set_vital` (every StatefulDataLoader made; shardsmith.torch silences that one call), and
PyTorch's "NumPy array is not writable" for images decoded with `decode="numpy"` (now writable).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.walkthrough  # make test-walkthroughs (a user's path, end to end: slow)

pytest.importorskip("torchdata")
pytest.importorskip("PIL")

ROOT = Path(__file__).resolve().parent.parent
LOOP = """
import torch
import shardsmith
from shardsmith.torch import TarIterable, TokenBatches
from torchdata.stateful_dataloader import StatefulDataLoader

images = shardsmith.open({images!r}, decode="numpy")
assert images[0]["jpg"].flags.writeable
loader = StatefulDataLoader(TarIterable(images, batch_size=4), batch_size=None, num_workers=1)
pixels = [torch.as_tensor(sample["jpg"]) for sample in next(iter(loader))]  # images of several sizes: no stack
assert all(p.dtype == torch.uint8 and p.ndim == 3 for p in pixels), [p.shape for p in pixels]
tokens = StatefulDataLoader(TokenBatches(shardsmith.TokenDataset({tokens!r}, seq_len=16), batch_size=2, seed=0),
                            batch_size=None, num_workers=0)
x, y = next(iter(tokens))
print("ok", len(pixels), tuple(x.shape))
"""


def test_the_readme_loops_run_under_warnings_as_errors(tmp_path: Path) -> None:
    images, tokens = tmp_path / "images", tmp_path / "tokens"
    for args in (["convert", ROOT / "examples/images", "-o", images, "--to", "webdataset"],
                 ["pack-tokens", ROOT / "examples/corpus/part-0.jsonl", "-o", tokens, "--train-tokenizer", "300"]):
        subprocess.run([sys.executable, "-m", "shardsmith", *map(str, args), "--quiet"], check=True, timeout=120)
    # every warning an error (-W's module field must name a module exactly, so "shardsmith" alone would not
    # reach shardsmith.torch: no category or module is left out)
    res = subprocess.run([sys.executable, "-W", "error", "-c", LOOP.format(images=str(images), tokens=str(tokens))],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.startswith("ok"), res.stdout
    assert "Warning" not in res.stderr, res.stderr


def test_the_demo_runs_with_every_warning_an_error(tmp_path: Path) -> None:
    """PYTHONWARNINGS reaches the demo's own process and every `shardsmith` command and worker it starts.
    One warning is let through, unseen by default: webdataset 1.0.2 leaves each shard file open when
    WebDataset has read it (ResourceWarning from webdataset.tariterators, not from our code or calls)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT),
           "PYTHONWARNINGS": "error,ignore::ResourceWarning:webdataset.tariterators"}
    res = subprocess.run([sys.executable, str(ROOT / "examples" / "demo.py"), "--out", str(tmp_path / "demo-out")],
                         capture_output=True, text=True, timeout=600, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "demo finished in" in res.stdout, res.stdout[-2000:]
    assert "Warning" not in res.stderr and "Traceback" not in res.stderr, res.stderr[-3000:]
