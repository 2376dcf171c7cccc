"""The fine-tuning section of docs/tokens.md runs as written (issue 30): its shell block from a folder
holding the repository's ``examples/``, then its PyTorch loop over the packed chat batches."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.walkthrough  # make test-walkthroughs (a user's path, end to end: slow)

ROOT = Path(__file__).resolve().parents[1]
pytest.importorskip("torch")
pytest.importorskip("torchdata.stateful_dataloader")


def section_blocks(title: str) -> list[tuple[str, str]]:
    """(language, code) of each fenced block of the docs/tokens.md section headed ``title``."""
    text = (ROOT / "docs" / "tokens.md").read_text(encoding="utf-8")
    start = text.index(f"### {title}")
    end = min(i for i in (text.find("\n## ", start + 1), text.find("\n### ", start + 1)) if i > 0)
    return re.findall(r"```(\w+)\n(.*?)```", text[start:end], flags=re.S)


def test_the_fine_tuning_section_runs_as_written(tmp_path):
    blocks = section_blocks("Fine-tuning data: conversations, loss masks, packed (`--chat`)")
    assert [lang for lang, _ in blocks] == ["bash", "python"]
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    shell = blocks[0][1]
    res = subprocess.run(["bash", "-e", "-c", shell], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr
    said = " ".join(line.lstrip("# ").strip() for line in shell.splitlines() if line.startswith("#"))
    assert " ".join(res.stdout.split()) == " ".join(said.split())  # the summary the README shows
    res = subprocess.run([sys.executable, "-c", blocks[1][1]], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr
    losses = [float(x) for x in re.findall(r"loss ([0-9.]+)", res.stdout)]
    assert len(losses) >= 3 and losses[-1] < losses[0], res.stdout  # it learns
    assert (tmp_path / "tour" / "tokens" / "sft-checkpoint.pt").is_file()
