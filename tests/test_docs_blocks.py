"""The documentation test: every runnable block of the README and of docs/ runs as written.

Each page runs in a scratch folder laid out like a fresh clone after `make demo` (the clone's
`examples/`, `recipes/`, `Makefile` and virtual environment, and a `demo-out/` made by the demo),
with the environment's `bin/` first on the PATH, as after `source .venv/bin/activate`. A page's
blocks share one shell, in order; a failing block fails the test with its page and line. No block
may print a warning (Python's `...Warning:` lines) or a traceback.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docblocks import RUN, blocks, script

pytestmark = pytest.mark.walkthrough  # make test-walkthroughs (a user's path, end to end: slow)

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
VENV = Path(sys.prefix)


def _page_id(path: Path) -> str:
    return str(path.relative_to(ROOT))


@pytest.fixture(scope="module")
def demo_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("demo") / "demo-out"
    subprocess.run([sys.executable, str(ROOT / "examples" / "demo.py"), "--out", str(out)],
                   check=True, capture_output=True, timeout=300)
    return out


def _scratch(tmp: Path, demo_out: Path, *, makes_demo: bool) -> Path:
    for name in ("examples", "recipes", "Makefile", "pyproject.toml"):
        (tmp / name).symlink_to(ROOT / name)
    # the clone's .venv as `make` sees it after `make demo`: the environment's files, and install markers newer
    # than pyproject.toml (so no target reinstalls the package, which would point it at this scratch folder)
    venv = tmp / ".venv"
    venv.mkdir()
    for name in ("bin", "lib", "include", "pyvenv.cfg"):
        if (VENV / name).exists():
            (venv / name).symlink_to(VENV / name)
    for marker in (".core", ".dev"):
        (venv / marker).touch()
    if not makes_demo:
        (tmp / "demo-out").symlink_to(demo_out)
    return tmp


def test_every_marker_is_well_formed_and_every_skip_gives_a_reason() -> None:
    for page in PAGES:
        for b in blocks(page, root=ROOT):
            assert b.skip is None or len(b.skip) > 10, f"{b.page}:{b.line}: a skip needs its reason"


@pytest.mark.parametrize("page", [p for p in PAGES if any(
    b.lang in RUN and b.skip is None for b in blocks(p, root=ROOT))], ids=_page_id)
def test_page_runs_as_written(page: Path, demo_out: Path, tmp_path: Path) -> None:
    page_blocks = blocks(page, root=ROOT)
    code = script(page_blocks)
    work = _scratch(tmp_path, demo_out, makes_demo="make demo" in code)
    (work / ".doc-page.sh").write_text(code)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "PYTEST_", "COV_"))}
    env.update(PATH=f"{VENV / 'bin'}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(VENV),
               HOME=str(tmp_path), PYTHONPATH=str(ROOT))
    with open(work / ".out", "wb") as out, open(work / ".err", "wb") as err:
        proc = subprocess.Popen(["bash", ".doc-page.sh"], cwd=work, env=env, stdout=out, stderr=err,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=420)
        finally:
            with contextlib.suppress(ProcessLookupError):  # a block's background server (moto_server &) ends too
                os.killpg(proc.pid, signal.SIGTERM)
    stdout, stderr = (work / ".out").read_text(errors="replace"), (work / ".err").read_text(errors="replace")
    ran = [line for line in stderr.splitlines() if line.startswith(">>> ")]
    assert rc == 0, f"{_page_id(page)}: the block at {ran[-1][4:] if ran else '?'} failed (exit {rc}):\n" \
                    f"--- stdout (tail)\n{stdout[-3000:]}\n--- stderr (tail)\n{stderr[-3000:]}"
    noisy = [line for line in stderr.splitlines() if "Warning:" in line or line.startswith("Traceback")]
    assert not noisy, f"{_page_id(page)} printed warnings:\n" + "\n".join(noisy)
