"""The runnable blocks of the README and the documentation pages, for the documentation test.

A fenced ``bash`` or ``python`` block runs, in page order, as one shell script per page (so an
`export` or a file made by one block is there for the next, as for a reader going down the page).
A block preceded by ``<!-- doctest: skip: REASON -->`` does not run (it needs a cluster, a GPU, a
network beyond this machine, or installs into the reader's environment); every other fence language
(``text``, ``toml``, a bare fence) is shown, not run.

Each page writes under a folder of its own, ``tour/<page>/`` (``own_folder``), so the pages run in
any order, each after the others, as a reader may take them.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

RUN = ("bash", "python")
SKIP = re.compile(r"<!--\s*doctest:\s*skip:\s*(?P<reason>[^>]*?)\s*-->")
FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w-]*)\s*$")  # indented: a block inside a list item
# `python -c "..."` in a shell block: the program, up to the closing quote that bash would see
PYTHON_C = re.compile(r'\bpython3? -c "(?P<code>(?:[^"\\]|\\.)*)"', re.S)


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    lang: str
    code: str
    skip: str | None


def blocks(path: Path, *, root: Path) -> list[Block]:
    """Every fenced block of one page; `skip` holds the reason of a skip marker right above it."""
    lines = path.read_text(encoding="utf-8").splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start, lang, indent = i, m["lang"], len(m["indent"])
        j = i + 1
        while j < len(lines) and not lines[j].lstrip().startswith("```"):
            j += 1
        above = lines[start - 1] if start else ""
        marker = SKIP.search(above)
        if "doctest" in above and marker is None:
            raise ValueError(f"{path}:{start}: a doctest marker must read <!-- doctest: skip: REASON -->")
        out.append(Block(page=str(path.relative_to(root)), line=start + 1, lang=lang,
                         code="\n".join(line[indent:] for line in lines[start + 1:j]),
                         skip=marker["reason"] if marker else None))
        i = j + 1
    return out


def script(page_blocks: list[Block]) -> str:
    """One bash script that runs a page's runnable blocks in order, stopping at the first failure."""
    parts = ["set -eo pipefail"]
    for b in page_blocks:
        if b.lang not in RUN or b.skip is not None:
            continue
        parts.append(f"echo '>>> {b.page}:{b.line} ({b.lang})' >&2")
        if b.lang == "bash":
            parts.append(b.code)
        else:
            name = f".doc-block-{b.line}.py"  # a file, as a reader saves a snippet (workers re-import it)
            parts.append(f"cat > {name} <<'SHARDSMITH_DOC_PY'\n{b.code}\nSHARDSMITH_DOC_PY\npython {name}")
    return "\n".join(parts) + "\n"


def own_folder(page: str) -> str:
    """Where a page's examples write: ``tour/readme/`` for the README, ``tour/<name>/`` for ``docs/<name>.md``."""
    name = Path(page).stem
    return f"tour/{'readme' if name == 'README' else name}/"


def imports(page_blocks: list[Block]) -> list[tuple[int, str]]:
    """(line, top-level module) of every import the runnable blocks make, in their Python blocks and in the
    ``python -c`` programs of their shell blocks; an import guarded by ``except ImportError`` (an optional
    speed-up, as flash-attn) is left out: the block runs without it."""
    found: list[tuple[int, str]] = []
    for b in page_blocks:
        if b.lang not in RUN or b.skip is not None:
            continue
        programs = [b.code] if b.lang == "python" else [
            re.sub(r'\\([\\"$`])', r"\1", m["code"]) for m in PYTHON_C.finditer(b.code)]
        for program in programs:
            found += [(b.line, module) for module in _imported(ast.parse(program))]
    return found


def _imported(tree: ast.AST) -> list[str]:
    """The top-level modules of the imports in ``tree`` that no ``except ImportError`` guards."""
    guarded = {id(node) for t in ast.walk(tree) if isinstance(t, ast.Try) and any(
        isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError") for h in t.handlers)
        for stmt in t.body for node in ast.walk(stmt)}
    out = []
    for node in ast.walk(tree):
        if id(node) in guarded:
            continue
        if isinstance(node, ast.Import):
            out += [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.append(node.module.split(".")[0])
    return out
