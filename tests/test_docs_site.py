"""The documentation site's settings (mkdocs.yml), read without building it (`make docs`, in CI, builds it
--strict): the API reference shows constructors and public bases only, search works in the site opened
from disk with no network, long code lines wrap, and the benchmarks page reads as a user's page."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
CONFIG = yaml.safe_load((ROOT / "mkdocs.yml").read_text())


def _plugin(name: str) -> dict | None:
    """A plugin's settings ({} when it has none); None when mkdocs.yml does not name it."""
    for entry in CONFIG["plugins"]:
        if entry == name:
            return {}
        if isinstance(entry, dict) and name in entry:
            return entry[name] or {}
    return None


def test_the_api_reference_shows_each_constructor_and_hides_private_names() -> None:
    """The members filter hides `__init__`, so its parameters (`seq_len=`, `split=`) show only when merged into
    the class; a private base (a module's `_Name` class) is replaced by its public bases in the class template."""
    mkdocstrings = _plugin("mkdocstrings")
    options = mkdocstrings["handlers"]["python"]["options"]
    assert options["merge_init_into_class"] is True and options.get("show_signature", True) is True
    assert "!^_" in options["filters"]
    template = ROOT / mkdocstrings["custom_templates"] / "python" / "material" / "class.html.jinja"
    text = template.read_text()
    assert '{% extends "_base/class.html.jinja" %}' in text and "{% block bases scoped %}" in text
    assert 'startswith("_")' in text and "resolved_bases" in text


def test_search_works_from_disk_with_no_network() -> None:
    """Material's offline plugin inlines the search index; the web-worker shim it needs on file:// is a copy in
    docs/ (the plugin's default is a URL on unpkg.com), and no font is fetched either."""
    assert _plugin("search") is not None and _plugin("offline") is not None
    assert CONFIG.get("use_directory_urls") is False and CONFIG["theme"]["font"] is False
    polyfills = CONFIG["extra"]["polyfills"]
    assert polyfills and not any(re.match(r"\w+://", url) for url in polyfills)
    assert any("IFrameWorker" in (ROOT / CONFIG["docs_dir"] / url).read_text() for url in polyfills)


def test_long_code_lines_wrap() -> None:
    css = "".join((ROOT / CONFIG["docs_dir"] / sheet).read_text() for sheet in CONFIG["extra_css"])
    rule = re.search(r"\.md-typeset pre > code\s*\{([^}]*)\}", css)
    assert rule and "white-space: pre-wrap" in rule[1]


def test_the_benchmarks_page_has_one_title_and_no_internal_issue_numbers() -> None:
    """docs/benchmarks.md includes bench/README.md (pymdownx.snippets, from a line on): the page as built."""
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    include = re.search(r'^--8<-- "(?P<path>[^":]+)(?::(?P<start>\d+):(?P<end>\d*))?"$', page, re.M)
    assert include, "docs/benchmarks.md: the include of bench/README.md is not where this test reads it"
    lines = (ROOT / include["path"]).read_text().splitlines()
    start = int(include["start"] or 1) - 1
    text = page.replace(include[0], "\n".join(lines[start:int(include["end"]) if include["end"] else None]))
    prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)  # a `# comment` in a shell block is no heading
    assert [line for line in prose.splitlines() if line.startswith("# ")] == ["# Benchmarks"]
    assert not re.findall(r"(?i)\bissues? \d+|\bsession \d+", text)


def test_the_design_page_is_the_contract_and_every_module_it_names_exists() -> None:
    """docs/design.md holds the contract (flow, layers, formats, protocols, guarantees) in at most 500
    lines, the implementation notes in the modules it names: each `path/module.py` it names is a file
    of the package (or of tests/ or bench/), so a move or a split updates the page."""
    text = (ROOT / "docs" / "design.md").read_text()
    assert len(text.splitlines()) <= 500
    named = set(re.findall(r"`((?:[a-z_]+/)+[a-z_]+\.py)`", text))
    assert named, "the page names no module"
    missing = sorted(p for p in named if not any((ROOT / base / p).is_file() for base in ("shardsmith", ".")))
    assert not missing, f"docs/design.md names modules that do not exist: {missing}"
