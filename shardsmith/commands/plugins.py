"""``shardsmith plugins``: every registered source, transform, format and record kind, where it comes
from, and whether it loads here (a missing optional dependency, or a plugin that fails to import)."""

from __future__ import annotations

import click

from shardsmith import registry
from shardsmith.errors import UsageError


def status(plugin: registry.Plugin) -> str:
    """``ok``, ``missing MODULE`` or ``cannot load: WHY``: what ``shardsmith convert`` would find."""
    missing = plugin.missing()
    if missing:
        return f"missing {', '.join(missing)}"
    try:
        plugin.load()
    except UsageError as exc:
        return f"cannot load: {str(exc).rpartition(': cannot load ')[2] or exc}"
    return "ok"


def run() -> None:
    found = registry.plugins()
    name_w = max((len(p.name) for p in found), default=12)
    target_w = max((len(p.target) for p in found), default=52)
    origin_w = max((len(p.origin) for p in found), default=12)
    for p in found:
        click.echo(f"{p.kind:<10} {p.name:<{name_w}} {p.target:<{target_w}} {p.origin:<{origin_w}} {status(p)}")
