"""The layout's rules, checked: layers that only look down and no import cycle (imports inside
functions and under ``TYPE_CHECKING`` included), no module over 400 lines, no format or source named
outside its registration (docs/design.md, "Layers" and "Layout rules")."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "shardsmith"
MAX_LINES = 400


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Every shardsmith module this one imports: at the top, inside a function, or for typing only."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {m: _imports(m, p, set(mods)) for m, p in mods.items()}


# Bottom first. A package (or top-level module) imports its own layer and those below it.
LAYERS: list[set[str]] = [
    {"errors", "core"},
    {"storage"},
    {"kit", "registry"},
    {"text"},
    {"sources", "transforms", "formats", "plugin"},
    {"engine", "loader"},
    {"torch", "torch_extra", "torch_feed", "torch_images", "shardsmith", "executors"},
    {"report"},
    {"commands", "demo"},
    {"cli_options", "cli_changes", "cli", "program", "__main__"},
    {"testing"},
]
# Within one layer these never import each other: the training-time loader runs without the engine,
# and plugins of one kind do not reach into another kind's package.
APART = [{"engine", "loader"}, {"sources", "transforms", "formats"}]


# The one engine module that reaches text: its document-cleaning stage (--dedup, --decontaminate,
# --provenance) takes a CleaningSpec and builds its worker's Cleaner from it. The training-time loader
# and the torch adapters never import text.
TEXT_SEAM = {"shardsmith.text.cleaning"}
# Chat modules outside text: commands stay in commands/, and the tokens format's report section reads
# the format's own mask files (formats/tokens/masks.py).
CHAT_OUTSIDE_TEXT = {"shardsmith.commands.chat_job", "shardsmith.commands.chat_options",
                     "shardsmith.formats.tokens.chat_report"}


def _package(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else "shardsmith"


def _layer(package: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if package in layer)


def test_every_package_has_a_layer() -> None:
    assert {_package(m) for m in _modules()} <= set().union(*LAYERS)


def test_imports_only_look_down() -> None:
    crossing = sorted((name, target) for name, targets in _graph().items() for target in targets
                      if (a := _package(name)) != (b := _package(target))
                      and (_layer(b) > _layer(a) or any({a, b} <= apart for apart in APART)))
    assert not crossing, "imports that climb a layer:\n" + "\n".join(f"  {a} -> {b}" for a, b in crossing)


def test_text_is_reached_from_the_engine_at_one_seam() -> None:
    """kit and core sit below text (test_imports_only_look_down); the engine imports only its seam,
    and the loader, the torch adapters and the executors nothing of text."""
    found = sorted((name, target) for name, targets in _graph().items() for target in targets
                   if _package(target) == "text"
                   and (_package(name) in {"loader", "torch", "torch_extra", "torch_feed", "torch_images",
                                           "executors"}
                        or (_package(name) == "engine" and target not in TEXT_SEAM)))
    assert not found, "text reached past its seam:\n" + "\n".join(f"  {a} -> {b}" for a, b in found)


def test_the_chat_feature_lives_in_text() -> None:
    """What only text uses is in one package: chat, its templates, tokenizers, MinHash, n-grams,
    normalization, decontamination and cleaning, not in kit (the protocols plugins build on) nor
    among the registered transforms."""
    text_only = re.compile(r"(chat|tokeniz|minhash|ngrams|textnorm|decontaminat|cleaning|hf_tables)")
    stray = sorted(m for m in _modules() if text_only.search(m.rpartition(".")[2])
                   and _package(m) != "text" and m not in CHAT_OUTSIDE_TEXT)
    assert not stray, f"text-only modules outside shardsmith/text: {stray}"


def test_no_import_cycles() -> None:
    graph = _graph()
    # a package's __init__ importing its own submodules is not a cycle of layers: leave parent edges out
    graph = {m: {t for t in ts if not m.startswith(t + ".")} for m, ts in graph.items()}
    cycles, state, stack = [], {}, []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                cycles.append(stack[stack.index(t):] + [t])
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_no_module_over_400_lines() -> None:
    long = {str(p.relative_to(PACKAGE.parent)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_formats_are_named_only_where_they_register() -> None:
    """``== "tokens"`` and the like: a command choosing by name instead of asking the registry."""
    pattern = re.compile(r"""[=!]= ["'](tokens|hdf5|webdataset|event-tar|imagefolder|jsonl|parquet|parquet-events|root)["']""")
    found = [f"{p.relative_to(PACKAGE.parent)}:{i}: {line.strip()}"
             for p in PACKAGE.rglob("*.py") for i, line in enumerate(p.read_text().splitlines(), 1)
             if pattern.search(line)]
    assert not found, "format or source names compared outside the registry:\n" + "\n".join(found)


# The layers below the formats decide nothing by a format's file names: each format declares what it
# writes (``Format.own_files``) and what goes with a shard (its record's companions), and they ask.
BELOW_FORMATS = ("core", "kit", "text", "engine", "storage")
# the built-in formats' suffixes that no declaration spells out as a pattern: the writers' shard
# suffixes and the token shards' companions (``.bin`` itself is left out: the engine's scratch files
# are ``part-000000.bin``, as are minhash's)
SHARD_SUFFIXES = (".tar", ".h5", ".idx", ".origins.npy", ".mask.bin", ".cu.npy")
# the modules that read a tokenizer given as an input, by HuggingFace's names for its files (the tokens
# format writes the same beside its shards, so that those tools read them)
INPUT_NAMES = {"shardsmith/text/tokenizer_folder.py": {"tokenizer.json", "tokenizer_config.json",
                                                       "special_tokens_map.json"},
               "shardsmith/text/tokenizer_class.py": {"tokenizer.json"},
               "shardsmith/text/tokenize.py": {"tokenizer.json"}}


def _builtin_format_names() -> set[str]:
    """The literal part of every name the built-in formats declare as their own (``*.wids.json``:
    ``.wids.json``; ``__index__``), and their shards' suffixes."""
    from shardsmith import registry
    from shardsmith.kit.writer import SHARD_NAMES

    names = set(SHARD_SUFFIXES)
    for plugin in registry.BUILTIN:
        if plugin.kind != "format":
            continue
        own = plugin._import(plugin.target).own_files
        for pattern in (*own.files, *(f.name for f in own.folders), *(h for f in own.folders for h in f.holds)):
            if pattern == SHARD_NAMES:
                continue
            literal = re.split(r"[*\]]", pattern)[-1]
            if literal not in ("", ".bin"):
                names.add(literal)
    return names


def _strings(path: Path) -> list[tuple[int, str]]:
    """The string constants of a module (f-strings' parts too), docstrings left out."""
    tree = ast.parse(path.read_text())
    docs = {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body
            and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs]


def test_no_format_file_name_below_the_formats() -> None:
    """core, kit, engine and storage name no built-in format's file (``"*.wids.json"``, ``"meta.pkl"``,
    ``"__index__"``, a ``.idx``): which files an output holds is the formats' to say."""
    names = _builtin_format_names()
    assert {".wids.json", "__index__", "meta.pkl", ".idx"} <= names, names
    found = []
    for package in BELOW_FORMATS:
        for path in sorted((PACKAGE / package).rglob("*.py")):
            rel = str(path.relative_to(PACKAGE.parent))
            allowed = INPUT_NAMES.get(rel, set())
            found += [f"{rel}:{line}: {text!r} names {name!r}" for line, text in _strings(path)
                      for name in sorted(names - allowed) if name in text]
    assert not found, "a format's file names below the formats:\n" + "\n".join(found)
