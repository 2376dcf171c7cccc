"""The report as one HTML file that opens offline: figures embedded as base64 ``data:`` URIs (and
also written beside it as PNG files), numbers in tables, every string from data escaped."""

from __future__ import annotations

import base64
import re
from html import escape
from pathlib import Path
from typing import Any

from shardsmith.core.fsutil import atomic_write_bytes
from shardsmith.kit.sections.model import Figure, Section, Table

REPORT = "report.html"
MAX_ROWS = 1_000  # rows of one table; the rest are left out, and the table says so

_STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 60em; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; border-bottom: 1px solid #ccc; margin-top: 2em; }
table { border-collapse: collapse; margin: 0.8em 0; font-size: 13px; }
th, td { border: 1px solid #ddd; padding: 2px 8px; text-align: right; }
td { white-space: pre-wrap; }  /* a token of spaces stays spaces: HTML would collapse them */
th { background: #f3f3f3; } td:first-child, th:first-child { text-align: left; }
caption { text-align: left; font-weight: 600; padding: 4px 0; }
figure { margin: 1em 0; } img { max-width: 100%; border: 1px solid #eee; }
.note { color: #555; } code { background: #f5f5f5; padding: 0 3px; }
"""


def file_names(sections: list[Section]) -> list[list[str]]:
    """Each figure's PNG file name: its place and its (sanitised) name, unique in the report."""
    names, n = [], 0
    for section in sections:
        row = []
        for fig in section.figures:
            n += 1
            row.append(f"{n:02d}-{re.sub(r'[^a-z0-9]+', '-', fig.name.lower()).strip('-')[:60] or 'figure'}.png")
        names.append(row)
    return names


def write(folder: Path, *, title: str, intro: list[str], sections: list[Section]) -> Path:
    """``folder/report.html`` and its PNG files; returns the HTML's path."""
    folder.mkdir(parents=True, exist_ok=True)
    names = file_names(sections)
    for section, row in zip(sections, names):
        for fig, name in zip(section.figures, row):
            atomic_write_bytes(folder / name, fig.png)
    page = render(title=title, intro=intro, sections=sections, names=names)
    path = folder / REPORT
    atomic_write_bytes(path, page.encode())
    return path


def render(*, title: str, intro: list[str], sections: list[Section], names: list[list[str]]) -> str:
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             f"<title>{escape(title)}</title><style>{_STYLE}</style></head><body>",
             f"<h1>{escape(title)}</h1>", *(f'<p class="note">{escape(line)}</p>' for line in intro)]
    if sections:
        parts.append("<ul>" + "".join(f'<li><a href="#s{i}">{escape(s.title)}</a></li>'
                                      for i, s in enumerate(sections)) + "</ul>")
    for i, (section, row) in enumerate(zip(sections, names)):
        parts.append(f'<h2 id="s{i}">{escape(section.title)}</h2>')
        parts.extend(f'<p class="note">{escape(line)}</p>' for line in section.notes)
        for fig, name in zip(section.figures, row):
            parts.append(_figure(fig, name))
        parts.extend(_table(t) for t in section.tables)
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _figure(fig: Figure, name: str) -> str:
    data = base64.b64encode(fig.png).decode("ascii")
    return (f'<figure><img src="data:image/png;base64,{data}" alt="{escape(fig.title)}">'
            f"<figcaption>{escape(fig.title)} (<code>{escape(name)}</code>)</figcaption></figure>")


def _table(t: Table) -> str:
    rows = t.rows[:MAX_ROWS]
    note = t.note or (f"the first {MAX_ROWS:,} of {len(t.rows):,} rows" if len(t.rows) > MAX_ROWS else "")
    head = "".join(f"<th>{escape(str(h))}</th>" for h in t.header)
    body = "".join("<tr>" + "".join(f"<td>{escape(_cell(c))}</td>" for c in r) + "</tr>" for r in rows)
    caption = escape(t.caption) + (f' <span class="note">({escape(note)})</span>' if note else "")
    return f"<table><caption>{caption}</caption><tr>{head}</tr>{body}</table>"


def _cell(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return "" if value is None else str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
