"""A training mixture kept in a recipe: the ``[mix]`` table of a ``recipes/*.toml`` file.

``shardsmith run mix.toml`` opens every source, checks the mixture (kinds, weights, paths) and
prints what it will draw: each source's samples, weight, draws and passes. The training script
builds the same mixture from the same file with ``from_recipe``, so the two never drift apart::

    [mix]
    seed = 0
    num_samples = 100000              # optional; default: no source repeats
    exhausted = "repeat"              # optional: a source that runs out repeats, or "stop" ends the mixture
    schedule = [0, 50000]             # optional: points of the sample index where weights are given
    schedule_unit = "samples"         # optional: or "tokens" (sources of a fixed seq_len)
    [mix.sources.web]
    path = "shards/web"               # a finished dataset (relative to the working directory)
    weight = [0.7, 0.5]               # one per point of schedule (or one number: the same at every point)
    split = "train"                   # optional, "train" by default
    loader = "TokenDataset"           # optional: a loader class of shardsmith.loader (default: open,
    seq_len = 128                     # which gives documents for tokens, PackedSequences for packed
                                      # tokens); seq_len for TokenDataset
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from shardsmith.core.manifest import MAX_COUNT
from shardsmith.core.words import plural
from shardsmith.errors import UsageError

SOURCE_KEYS = {"path", "weight", "split", "loader", "seq_len"}
LOADERS = ("EventDataset", "EventTarDataset", "PackedSequences", "TarDataset", "TokenDataset", "TokenDocuments")


def check(table: Any, *, where: str) -> dict[str, Any]:
    """The ``[mix]`` table, checked: seed, optional num_samples, sources with a path and a weight."""
    if not isinstance(table, Mapping):
        raise UsageError(f"{where}: [mix] must be a table")
    unknown = set(table) - {"seed", "num_samples", "sources", "schedule", "schedule_unit", "exhausted"}
    if unknown:
        raise UsageError(f"{where}: unknown keys {sorted(unknown)} in [mix] (seed, num_samples, exhausted, "
                         f"schedule, schedule_unit, sources)")
    if table.get("schedule_unit", "samples") not in ("samples", "tokens"):
        raise UsageError(f"{where}: [mix] schedule_unit must be \"samples\" or \"tokens\"")
    points = table.get("schedule")
    if points is not None and (not isinstance(points, list) or not points or not all(
            type(x) is int and 0 <= x <= MAX_COUNT for x in points)):
        raise UsageError(f"{where}: [mix] schedule must be a list of sample positions, e.g. [0, 50000]")
    if table.get("exhausted", "repeat") not in ("repeat", "stop"):
        raise UsageError(f"{where}: [mix] exhausted must be \"repeat\" or \"stop\"")
    seed, num = table.get("seed", 0), table.get("num_samples")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise UsageError(f"{where}: [mix] seed must be an integer")
    if num is not None and (isinstance(num, bool) or not isinstance(num, int) or not 0 <= num <= MAX_COUNT):
        raise UsageError(f"{where}: [mix] num_samples must be a count (0 to 2**62)")
    sources = table.get("sources")
    if not isinstance(sources, Mapping) or not sources:
        raise UsageError(f"{where}: [mix.sources.NAME] tables (path, weight) are missing")
    for name, source in sources.items():
        if not isinstance(source, Mapping) or not isinstance(source.get("path"), str) or "weight" not in source:
            raise UsageError(f"{where}: [mix.sources.{name}] needs path = \"...\" and weight = ...")
        if set(source) - SOURCE_KEYS:
            raise UsageError(f"{where}: unknown keys {sorted(set(source) - SOURCE_KEYS)} in [mix.sources.{name}]")
        if source.get("loader", "open") not in ("open", *LOADERS):
            raise UsageError(f"{where}: [mix.sources.{name}] loader must be one of {', '.join(LOADERS)}")
        if "seq_len" in source and source.get("loader") != "TokenDataset":  # the one loader that takes it
            raise UsageError(f"{where}: [mix.sources.{name}] seq_len is for loader = \"TokenDataset\" "
                             f"(windows of seq_len tokens); the default loader gives whole documents")
        if "seq_len" in source and (type(source["seq_len"]) is not int or not 1 <= source["seq_len"] < 1 << 31):
            raise UsageError(f"{where}: [mix.sources.{name}] seq_len must be a whole number of tokens (1 to 2**31 - 1)")
        if not isinstance(source.get("split", "train"), str):
            raise UsageError(f"{where}: [mix.sources.{name}] split must be a split's name")
        weight = source["weight"]
        if isinstance(weight, list) and points is None:
            raise UsageError(f"{where}: [mix.sources.{name}] weight is a list: give [mix] schedule = [...], the "
                             f"sample positions of its points")
        if isinstance(weight, list) and len(weight) != len(points):
            raise UsageError(f"{where}: [mix.sources.{name}] weight: {len(weight)} weights for the {len(points)} "
                             f"points of schedule")
    return {"seed": seed, "num_samples": num, "schedule": points, "exhausted": table.get("exhausted", "repeat"),
            "schedule_unit": table.get("schedule_unit", "samples"), "sources": {n: dict(s) for n, s in sources.items()}}


def override(table: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """``--set seed=N``, ``--set num_samples=N`` or ``--set NAME=WEIGHT`` (one source's weight)."""
    table = {**table, "sources": {n: dict(s) for n, s in table["sources"].items()}}
    for item in overrides:
        key, sep, value = item.partition("=")
        key = key.strip()
        try:
            if key in ("seed", "num_samples", "num-samples") and sep:
                table[key.replace("-", "_")] = int(value)
            elif key in table["sources"] and sep:
                table["sources"][key]["weight"] = float(value)
            else:
                raise ValueError
        except ValueError:
            raise UsageError(f"--set {item!r}: a mix recipe takes seed=N, num_samples=N or SOURCE=WEIGHT "
                             f"(sources: {', '.join(table['sources'])})") from None
    return table


def build(table: Mapping[str, Any]) -> Any:
    """The ``Mixture`` a checked ``[mix]`` table describes (its datasets opened by their manifests)."""
    import shardsmith.loader

    datasets = {}
    for name, source in table["sources"].items():
        if not Path(source["path"]).is_dir():
            raise UsageError(f"[mix.sources.{name}]: {source['path']} is not a dataset folder")
        extra = {"seq_len": source["seq_len"]} if "seq_len" in source else {}
        loader = getattr(shardsmith.loader, source.get("loader", "open"))
        datasets[name] = loader(source["path"], split=source.get("split", "train"), **extra)
    weights = {name: source["weight"] for name, source in table["sources"].items()}
    if table.get("schedule") is not None:
        weights = shardsmith.loader.Schedule(at=table["schedule"], weights=weights,
                                             unit=table.get("schedule_unit", "samples"))
    return shardsmith.loader.mix(datasets, weights, seed=table["seed"], num_samples=table["num_samples"],
                                 exhausted=table.get("exhausted", "repeat"))


def from_recipe(path: str | Path, *, overrides: Sequence[str] = ()) -> Any:
    """The ``Mixture`` of a recipe file's ``[mix]`` table (what ``shardsmith run`` prints)."""
    import tomllib

    try:
        recipe = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"{path}: not a readable TOML recipe ({exc})") from None
    if "mix" not in recipe:
        raise UsageError(f"{path}: the recipe has no [mix] table")
    return build(override(check(recipe["mix"], where=str(path)), overrides))


def describe(m: Any) -> str:
    """What a mixture draws, one line per source."""
    drawn = m.report()["sources"]
    held = "its scheduled count" if m.ramps else "weight·n times"
    lines = [f"mixture of {plural(len(m.names), 'source')}: {plural(len(m), 'sample')}, seed {m.seed}; every prefix of n samples "
             f"holds each source {held} within {m.deviation_bound:.3f}"]
    if m.ramps:
        at = m.schedule.at
        lines.append(f"schedule: shares at samples {', '.join(f'{x:,}' for x in at)}, linear between them")
    width = max(len(n) for n in m.names)
    for name in m.names:
        cycles = "  (cycles: new shuffled passes)" if name in m.cycling else ""
        weight = f"{m.weights[name]:.3f}"
        if m.ramps:
            weight = " -> ".join(f"{m.shares_at(x)[name]:.3f}" for x in m.schedule.at)
        lines.append(f"  {name:<{width}}  weight {weight}  samples {m.lengths[name]:>10,}  "
                     f"drawn {drawn[name]['drawn'] - m.consumed[name]:>10,}  passes {m.epochs[name]:.2f}{cycles}")
    return "\n".join(lines)
