"""The layout's rules, checked: layers that only look down and no import cycle (imports inside
functions and under ``TYPE_CHECKING`` included), the engine's subpackages in their order behind its
public face, no module over 400 lines, no format or source named outside its registration
(docs/design.md, "Layers" and "Layout rules")."""

from __future__ import annotations

import ast
import importlib
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


# The engine's subpackages, bottom first (``shardsmith/engine/__init__.py`` says what each holds): each
# imports those before it, never one after it nor a module of the engine's own folder but its plain
# values (the options record and the units). The engine's own folder holds the job and the run of it.
ENGINE_LAYERS = ["processes", "output", "inputs", "shuffle", "copying"]
ENGINE_VALUES = {"shardsmith.engine.options", "shardsmith.engine.units"}
ENGINE_TOP = {"job", "units", "options", "choose", "conduct", "finish", "output_for"}
# What the layers above the engine import past its public face (``shardsmith.engine``: the job, its
# steps, its units, run_job and run_unit), and why. A new one goes through the face, or here.
PAST_THE_FACE = {
    "shardsmith.engine.processes.interrupt": ({"cli", "cli_options", "program"},
                                              "the program's signal handling, installed before anything runs"),
    "shardsmith.engine.processes.workers": ({"cli", "cli_options"}, "--workers' default"),
    "shardsmith.engine.processes.forked": ({"commands.engine_check"},
                                           "the engine check's reference side, in a forked child"),
    "shardsmith.engine.inputs.files": ({"cli", "commands.inspect_report"},
                                       "input folders listed before the rest is imported (walk_soon); inspect's inputs"),
    "shardsmith.engine.inputs.plan": ({"commands.convert", "commands.convert_events", "commands.token_job"},
                                      "what a command computes once per run, kept in the scratch folder (cached)"),
    "shardsmith.engine.inputs.url_inputs": ({"commands.token_job"}, "a tokenizer beside URL inputs (input_root)"),
    "shardsmith.engine.choose": ({"commands.convert", "commands.inspect_report"},
                                 "convert's and inspect's choice of source and format"),
    "shardsmith.engine.output.resume": ({"cli_changes", "commands.convert_events"},
                                        "the run's identity: which options change the bytes"),
    "shardsmith.engine.output.outdir": ({"commands.token_job", "executors.base", "executors.slurm"},
                                        "the scratch folder's path; the line of a dataset already complete"),
    "shardsmith.engine.output.session": ({"executors.base"}, "the driver's release of a failed run's claim"),
    "shardsmith.engine.output.outlock": ({"executors.remote"}, "a unit refused for a held output, as one line"),
    "shardsmith.engine.shuffle.scatter": ({"commands.chat_job"}, "the scatter's counts summed for the manifest"),
}


def _engine_part(name: str) -> str | None:
    """The engine's subpackage a module is in, "" for the engine's own folder, None outside the engine."""
    parts = name.split(".")
    if parts[:2] != ["shardsmith", "engine"]:
        return None
    return parts[2] if len(parts) > 3 or (len(parts) == 3 and parts[2] in ENGINE_LAYERS) else ""


def test_the_engine_s_own_folder_holds_the_job_and_its_run_only() -> None:
    """A new module goes into the subpackage of its job (or joins ENGINE_TOP with a reason)."""
    top = {m.rpartition(".")[2] for m in _modules() if _engine_part(m) == "" and m != "shardsmith.engine"}
    assert top == ENGINE_TOP
    assert {m.split(".")[2] for m in _modules() if _engine_part(m)} == set(ENGINE_LAYERS)


def test_the_engine_s_subpackages_only_look_down() -> None:
    order = {p: i for i, p in enumerate(ENGINE_LAYERS)}
    crossing = sorted((name, target) for name, targets in _graph().items() if _engine_part(name) in order
                      for target in targets if (b := _engine_part(target)) is not None
                      and target not in ENGINE_VALUES
                      and (b not in order or order[b] > order[_engine_part(name)]))
    assert not crossing, "engine imports that climb:\n" + "\n".join(f"  {a} -> {b}" for a, b in crossing)


def test_the_engine_s_face_is_imported_from_above_only() -> None:
    """No engine module imports ``shardsmith.engine`` itself (its names come lazily from the modules
    below), and every public name is one the face imports for type checkers."""
    import shardsmith.engine as face

    inside = sorted(n for n, ts in _graph().items() if _package(n) == "engine" and "shardsmith.engine" in ts
                    and n != "shardsmith.engine")
    assert not inside, f"engine modules importing the engine's face: {inside}"
    assert sorted(face.__all__) == sorted(face._FACE)
    typed = {a.asname or a.name: node.module for node in ast.walk(ast.parse(_modules()["shardsmith.engine"].read_text()))
             if isinstance(node, ast.ImportFrom) and node.module for a in node.names}
    assert {n: typed.get(n) for n in face.__all__} == {n: f"shardsmith.engine.{m}" for n, m in face._FACE.items()}
    for name in face.__all__:
        assert getattr(face, name) is getattr(importlib.import_module(typed[name]), name)


def test_layers_above_the_engine_use_its_face() -> None:
    """Commands, executors and the command line import ``shardsmith.engine`` and the modules of
    PAST_THE_FACE (each for its reason), nothing else of the engine."""
    found = {}
    for name, targets in _graph().items():
        if _package(name) in {"engine", "loader"} or _layer(_package(name)) <= _layer("engine"):
            continue
        for target in targets:
            if _package(target) == "engine" and target != "shardsmith.engine":
                found.setdefault(target, set()).add(name.removeprefix("shardsmith."))
    assert found == {m: users for m, (users, _) in PAST_THE_FACE.items()}


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
