"""A core install meets inputs and options that need an extra: one line naming the extra (worded by
``errors.install_hint``), never a traceback, and refused before any work where the options say so.

The extra's packages are made absent in the child process the way Python marks a module that cannot
be imported (``sys.modules[name] = None``: ``import`` raises ImportError, ``find_spec`` finds
nothing), before shardsmith is imported; nothing else is replaced. tests/test_plugin_package.py
checks the ROOT case again in a real core-only virtual environment.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from shardsmith.errors import install_hint

ROOT = Path(__file__).resolve().parent.parent
IMAGES = ROOT / "examples" / "images"
PROGRAM = """
import sys
for name in sys.argv[1].split(","):
    sys.modules[name] = None  # as for a module that is not installed
sys.argv = ["shardsmith", *sys.argv[2:]]
from shardsmith.program import main
main()
"""


def without(modules: str, *args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``shardsmith ARGS`` in a process where ``modules`` (comma-separated) cannot be imported."""
    return subprocess.run([sys.executable, "-c", PROGRAM, modules, *map(str, args)], capture_output=True, text=True,
                          timeout=120, cwd=cwd, env={**os.environ, "PYTHONPATH": str(ROOT)})


def one_line(res: subprocess.CompletedProcess[str]) -> str:
    """The error line (after any progress line), the run refused with exit 2 and no traceback."""
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-3000:]
    line = res.stderr.splitlines()[-1]
    assert line.startswith("shardsmith: error: "), res.stderr
    return line


def test_images_convert_on_a_core_install_and_full_checks_name_the_images_extra(tmp_path: Path) -> None:
    """Copying images needs no decoder (headers are read in Python); decoding every image needs
    Pillow: convert --check-images full is refused before it writes anything, verify --deep at once."""
    pytest.importorskip("PIL")  # (the dataset verified below is made by a run that has it)
    no_images = "PIL,simplejpeg"
    res = without(no_images, "convert", IMAGES, "-o", tmp_path / "tar", "--to", "webdataset", "-q", cwd=tmp_path)
    assert res.returncode == 0 and (tmp_path / "tar" / "manifest.json").exists(), res.stderr
    line = one_line(without(no_images, "convert", IMAGES, "-o", tmp_path / "full", "--to", "webdataset",
                            "--check-images", "full", "-q", cwd=tmp_path))
    assert line == f"shardsmith: error: --check-images full needs Pillow, which is not installed: {install_hint('images')}"
    assert not (tmp_path / "full").exists()
    line = one_line(without(no_images, "verify", tmp_path / "tar", "--deep", cwd=tmp_path))
    assert line.endswith(f"needs Pillow, which is not installed: {install_hint('images')}"), line
    line = one_line(without(no_images, "convert", IMAGES, "-o", tmp_path / "aug", "--to", "webdataset",
                            "--augment", "hflip", "-q", cwd=tmp_path))
    assert line.endswith(f"needs PIL, which is not installed: {install_hint('images')}"), line
    assert subprocess.run([sys.executable, "-m", "shardsmith", "verify", tmp_path / "tar", "--deep"],
                          capture_output=True, timeout=120).returncode == 0  # with Pillow: the same dataset passes


def test_a_root_file_without_uproot_names_the_root_extra(tmp_path: Path) -> None:
    """Found by its suffix or named with --from: the root extra, not "not a supported input"."""
    pytest.importorskip("uproot")  # (to make the file)
    from shardsmith.demo.root_files import make_icecube_like

    root = make_icecube_like(tmp_path / "in" / "run.root", events=20, mean_pulses=3, seed=0)
    for args in ((root.parent,), (root, "--from", "root")):
        line = one_line(without("uproot,awkward", "convert", *args, "-o", tmp_path / "out", "--to", "hdf5",
                                cwd=tmp_path))
        assert line.endswith(f"uproot, awkward, which is not installed: {install_hint('root')}"), line
        assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("module", ["shardsmith.torch", "shardsmith.torch_feed", "shardsmith.torch_images"])
def test_the_torch_adapters_without_torch_name_the_torch_extra(module: str, tmp_path: Path) -> None:
    """`import shardsmith.torch` in a user's script, torch not installed: the error is one line naming the extra
    (not Python's bare "No module named 'torch'"), with nothing chained to it, and still a ModuleNotFoundError."""
    program = (f"import sys\nsys.modules['torch'] = None  # as for a module that is not installed\n"
               f"try:\n    import {module}\nexcept ModuleNotFoundError as e:\n    assert e.name == 'torch'\n    raise\n")
    res = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 1, res.stderr
    assert res.stderr.splitlines()[-1] == \
        f"ModuleNotFoundError: {module} needs torch, which is not installed: {install_hint('torch')}", res.stderr
    assert "During handling" not in res.stderr and "direct cause" not in res.stderr, res.stderr
