"""The documentation test: every runnable block of the README and of docs/ runs as written.

Each page runs in a scratch folder laid out like a fresh clone after `make demo` (the clone's
`examples/`, `recipes/`, `Makefile` and virtual environment, and a `demo-out/` made by the demo),
with the environment's `bin/` first on the PATH, as after `source .venv/bin/activate`. A page's
blocks share one shell, in order; a failing block fails the test with its page and line. No block
may print a warning (Python's `...Warning:` lines) or a traceback.

A reader takes the pages in any order, in one clone: so a page writes only under its own folder,
`tour/<page>/` (`docblocks.own_folder`), never into `demo-out/` or another page's files, and what it
imports comes with `make demo` or with an install the page names before. Both are checked on every
run; running every page again in one folder, one after the other (the README, then the site's nav),
is the slow proof of the same. The file runs in `make test-walkthroughs`, not in `make test`.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.docblocks import RUN, blocks, imports, own_folder, script

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

pytestmark = pytest.mark.walkthrough  # make test-walkthroughs (a user's path, end to end: slow)

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
VENV = Path(sys.prefix)
# files the test itself puts in the scratch folder: the page's script, its output, its Python blocks
HARNESS = re.compile(r"\.(doc-page\.sh|out|err|doc-block-\d+\.py)")
# what a page may write besides its own folder: `make demo` makes demo-out/ (a second run makes the same files),
# and the tiny recipe writes its `out` (recipes/tiny-tokens.toml), which no other page touches
ALSO_WRITES = {"README.md": ("demo-out/",), "docs/getting-started.md": ("demo-out/", "build/tiny-tokens/")}


def _page_id(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _runs(page: Path) -> bool:
    return any(b.lang in RUN and b.skip is None for b in blocks(page, root=ROOT))


@pytest.fixture(scope="module")
def demo_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("demo") / "demo-out"
    subprocess.run([sys.executable, str(ROOT / "examples" / "demo.py"), "--out", str(out)],
                   check=True, capture_output=True, timeout=300)
    return out


def _scratch(tmp: Path, demo_out: Path | None) -> Path:
    """A clone's folder under ``tmp``; with ``demo_out``, after `make demo` (else a page makes it itself)."""
    work = tmp / "clone"
    work.mkdir()
    for name in ("examples", "recipes", "Makefile", "pyproject.toml"):
        (work / name).symlink_to(ROOT / name)
    # the clone's .venv as `make` sees it after `make demo`: the environment's files, and install markers newer
    # than pyproject.toml (so no target reinstalls the package, which would point it at this scratch folder)
    venv = work / ".venv"
    venv.mkdir()
    for name in ("bin", "lib", "include", "pyvenv.cfg"):
        if (VENV / name).exists():
            (venv / name).symlink_to(VENV / name)
    for marker in (".core", ".dev"):
        (venv / marker).touch()
    if demo_out is not None:
        (work / "demo-out").symlink_to(demo_out)
    return work


def _files(folder: Path, prefix: str = "") -> dict[str, tuple[int, int]]:
    """Every file under ``folder`` (links not followed) as ``prefix`` + its relative path: size, mtime."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            found[prefix + os.path.relpath(path, folder)] = (st.st_size, st.st_mtime_ns)
    return found


def _run(page: Path, work: Path) -> None:
    """The page's blocks in order, as one shell in ``work`` (HOME beside it); fails naming the block that failed."""
    home = work.parent / "home"
    home.mkdir(exist_ok=True)
    (work / ".doc-page.sh").write_text(script(blocks(page, root=ROOT)))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "PYTEST_", "COV_"))}
    env.update(PATH=f"{VENV / 'bin'}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(VENV),
               HOME=str(home), PYTHONPATH=str(ROOT))
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


def test_every_marker_is_well_formed_and_every_skip_gives_a_reason() -> None:
    for page in PAGES:
        for b in blocks(page, root=ROOT):
            assert b.skip is None or len(b.skip) > 10, f"{b.page}:{b.line}: a skip needs its reason"


@pytest.mark.parametrize("page", [p for p in PAGES if _runs(p)], ids=_page_id)
def test_page_runs_as_written_and_writes_only_its_own_folder(page: Path, demo_out: Path, tmp_path: Path) -> None:
    makes_demo = "make demo" in script(blocks(page, root=ROOT))
    work = _scratch(tmp_path, None if makes_demo else demo_out)
    before = {**_files(work), **_files(demo_out, "demo-out/")}
    _run(page, work)
    after = {**_files(work), **_files(demo_out, "demo-out/")}
    allowed = (own_folder(_page_id(page)), *ALSO_WRITES.get(_page_id(page), ()))
    strays = sorted(path for path, stat in after.items() if before.get(path) != stat
                    and not HARNESS.fullmatch(path) and not path.startswith(allowed))
    assert not strays, (f"{_page_id(page)} writes outside {allowed[0]}, where another page (or the same page run "
                        f"after another) may meet it: {strays[:10]}")


def _extras() -> dict[str, set[str]]:
    """The distributions the core ("") and each extra of pyproject.toml install ([all]'s extras included)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    groups = {"": project["dependencies"], **project["optional-dependencies"]}

    def dists(group: str) -> set[str]:
        found: set[str] = set()
        for spec in groups[group]:
            req = Requirement(spec)
            found |= (set().union(*(dists(e) for e in req.extras)) if canonicalize_name(req.name) == "shardsmith"
                      else {canonicalize_name(req.name)})
        return found

    return {group: dists(group) for group in groups}


def _installs_named(page: Path, extras: dict[str, set[str]]) -> list[tuple[int, set[str]]]:
    """(line, distributions) of every install the page tells its reader of: an extra (`.[torch]`,
    `shardsmith[s3]`), or a `pip install NAME ...` of other packages."""
    named = []
    for at, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        found: set[str] = set()
        for m in re.finditer(r"(?:\.|shardsmith)\[([\w,]+)\]", line):
            found |= set().union(*(extras[e] for e in m[1].split(",")))
        for m in re.finditer(r"pip install ([^`#\n]*)", line):
            for word in m[1].split():
                name = re.match(r"[A-Za-z0-9][\w.-]*", word.strip("'\""))
                if name and not word.startswith(("-", ".", "/", "'.", "shardsmith")):
                    found.add(canonicalize_name(name[0]))
        if found:
            named.append((at, found))
    return named


def test_what_a_page_imports_comes_with_make_demo_or_an_install_named_before_it() -> None:
    """A reader who ran `make demo` and the installs a page names above a block has what the block imports;
    the torch extra brings torchdata, which every training example imports."""
    extras = _extras()
    demo = re.search(r"^\$\(VENV\)/\.core:.*\n\t\$\(PIP\) install -e '\.\[([\w,]+)\]'",
                     (ROOT / "Makefile").read_text(), re.M)
    assert demo, "Makefile: the extras `make demo` installs are not where this test reads them"
    after_demo = extras[""].union(*(extras[e] for e in demo[1].split(",")))
    installed_as = importlib.metadata.packages_distributions()
    lacking = []
    for page in PAGES:
        named = _installs_named(page, extras)
        for line, module in imports(blocks(page, root=ROOT)):
            if module in sys.stdlib_module_names or module == "shardsmith":
                continue
            dists = {canonicalize_name(d) for d in installed_as.get(module, ())}
            if not dists & after_demo.union(*(found for at, found in named if at < line)):
                lacking.append(f"{_page_id(page)}:{line}: imports {module} ({', '.join(sorted(dists))})")
    assert not lacking, "neither `make demo` nor an install the page names before brings:\n" + "\n".join(lacking)


def _reading_order() -> list[Path]:
    """The README, then the pages in the order of the site's navigation (mkdocs.yml's nav)."""
    def pages(entry: object) -> list[str]:
        if isinstance(entry, str):
            return [entry]
        items = entry.values() if isinstance(entry, dict) else entry
        return [page for item in items for page in pages(item)]

    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    return [ROOT / "README.md", *(ROOT / "docs" / page for page in pages(nav))]


def test_the_pages_run_one_after_the_other_in_one_clone(tmp_path: Path) -> None:
    order = _reading_order()
    assert sorted(order) == sorted(PAGES), "a page is missing from mkdocs.yml's nav"
    work = _scratch(tmp_path, None)  # the README's `make demo` makes demo-out/
    for page in order:
        if _runs(page):
            _run(page, work)
