"""The figures, drawn with matplotlib's Agg backend (no display, no pyplot state) into PNG bytes.

Every figure has a title, axis labels with units, and stays small (about 700 x 400 pixels).
Text from data (class names, tokens, field names) is drawn as plain text: mathtext is off, so
a ``$`` in a name is a dollar sign, never a formula or an error.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from shardsmith.core.words import plural
from shardsmith.kit.sections.model import Figure

SIZE = (7.0, 4.0)  # inches, at DPI: 700 x 400 pixels
DPI = 100
_RC = {"text.parse_math": False, "font.size": 9, "axes.titlesize": 10}


def _draw(name: str, title: str, paint: Callable[[Any], None], *, size: tuple[float, float] = SIZE,
          layout: str | None = "constrained") -> Figure:
    """``layout=None``: the painter places the axes (a grid of panels: constrained layout costs
    about a second for twelve of them)."""
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure as MplFigure

    with matplotlib.rc_context(_RC):
        fig = MplFigure(figsize=size, dpi=DPI, layout=layout)
        FigureCanvasAgg(fig)
        paint(fig)
        buf = io.BytesIO()
        with warnings.catch_warnings():  # a glyph the font lacks (CJK tokens) is drawn as a box: no warning
            warnings.filterwarnings("ignore", message="Glyph .* missing from font", category=UserWarning)
            fig.savefig(buf, format="png", metadata={"Software": None})
    return Figure(name=name, title=title, png=buf.getvalue())


def bar(name: str, *, title: str, labels: Sequence[str], values: Sequence[float], xlabel: str,
        ylabel: str) -> Figure:
    """One bar per label (class counts, label balance); labels turned when there are many."""
    def paint(fig: Any) -> None:
        ax = fig.add_subplot()
        ax.bar(range(len(values)), values, color="#4477aa")
        ax.set_xticks(range(len(labels)), [_short(s) for s in labels],
                      rotation=90 if len(labels) > 8 else 0, fontsize=8 if len(labels) <= 30 else 6)
        ax.set(title=title, xlabel=xlabel, ylabel=ylabel)

    return _draw(name, title, paint)


def hist(name: str, *, title: str, values: np.ndarray, xlabel: str, ylabel: str = "count",
         log_x: bool = False, log_y: bool = False, bins: int = 50, mark: tuple[float, str] | None = None) -> Figure:
    """A histogram; ``log_x`` puts logarithmic bins on a logarithmic axis (lengths, sizes);
    ``mark``: a vertical line at a value, with its legend (``--seq-len``)."""
    v = np.asarray(values, dtype=np.float64)

    def paint(fig: Any) -> None:
        ax = fig.add_subplot()
        _hist_into(ax, v, bins=bins, log_x=log_x)
        if log_y:
            ax.set_yscale("log")
        if mark is not None:
            ax.axvline(mark[0], color="#cc3311", linestyle="--", linewidth=1, label=mark[1])
            ax.legend(loc="upper right")
        ax.set(title=title, xlabel=xlabel, ylabel=ylabel)

    return _draw(name, title, paint)


def grid_step(v: np.ndarray) -> float | None:
    """The spacing of data that lie on a regular grid (whole numbers, detector positions every 17 m), or None.

    Such data binned by equal-width bins get one or two grid values a bin by turns: alternating bars
    and false spikes. Looked for among at most 1,000 distinct values."""
    u = np.unique(v)
    if len(u) < 2 or len(u) > 1000:
        return 1.0 if len(u) > 1000 and np.array_equal(v, np.round(v)) else None
    step = float(np.diff(u).min())
    k = (u - u[0]) / step
    return step if np.allclose(k, np.round(k), rtol=0, atol=1e-3) else None


def grid_edges(lo: float, hi: float, step: float, bins: int) -> np.ndarray:
    """Bin edges for data on a grid of ``step``: each bin holds the same number of grid values, centred
    on them, so no bin gets an extra one (a spike) and none gets none (a gap)."""
    values = int(round((hi - lo) / step)) + 1
    per_bin = max(1, -(-values // bins))  # ceil(values / bins) grid values a bin
    starts = lo - step / 2 + np.arange(-(-values // per_bin)) * per_bin * step
    return np.append(starts, hi + step / 2)  # the last bin ends at the last value: narrower, not emptier


def log_grid_edges(lo: float, hi: float, step: float, bins: int) -> np.ndarray:
    """Logarithmic bins for multiples of ``step`` (lengths, bytes), about ``bins`` of them: each holds
    a whole run of grid values, centred on them, and never fewer than the bin before it. Rounded
    geometric edges hold 1 and 2 values by turns where the bins are a value or two wide: false spikes."""
    a, b = int(round(lo / step)), int(round(hi / step))
    if b - a + 1 <= bins:  # few values: one bin each
        return (np.arange(a, b + 2) - 0.5) * step
    grow = ((b + 1) / a) ** (1 / bins) - 1
    edges, k, width = [a - 0.5], a, 1
    while k <= b:
        width = max(width, int(round(k * grow)))
        k += width
        edges.append(min(k, b + 1) - 0.5)  # the last bin ends at the last value: narrower, not emptier
    return np.asarray(edges) * step


def _hist_into(ax: Any, v: np.ndarray, *, bins: int, log_x: bool) -> None:
    from matplotlib.ticker import MaxNLocator

    if not len(v):
        ax.text(0.5, 0.5, "no values", ha="center", va="center", transform=ax.transAxes)
        return
    lo, hi = float(v.min()), float(v.max())
    step = grid_step(v) if hi > lo else None
    if hi == lo:  # one value: one bar at it, labelled (a bin of width 1 put ticks at -0.4 and 0.6)
        ax.bar([lo], [len(v)], width=max(abs(lo), 1.0) * 0.1, color="#4477aa")
        ax.margins(x=4.5, y=0.15)  # a bar a tenth of the axis wide, room above it for the words
        ax.set_xticks([lo], [_plain(lo)])
        said = f"all {len(v):,} values are {_plain(lo)}" if len(v) > 1 else f"one value: {_plain(lo)}"
        ax.text(0.5, 0.97, said, ha="center", va="top", transform=ax.transAxes, fontsize=8)
    elif log_x and lo > 0:
        whole = step is not None and np.allclose(v / step, np.round(v / step), rtol=0, atol=1e-3)
        edges = log_grid_edges(lo, hi, step, bins) if whole else np.geomspace(lo, hi, bins + 1)
        ax.hist(v, bins=edges, color="#4477aa")
        ax.set_xscale("log")
        _log_ticks(ax)
    elif step is not None:  # counts, ids, flags, positions on a grid
        ax.hist(v, bins=grid_edges(lo, hi, step, bins), color="#4477aa")
        if step == round(step):  # whole numbers: no tick at 2.5
            ax.xaxis.set_major_locator(MaxNLocator(integer=True, nbins=6))
    else:
        ax.hist(v, bins=bins, color="#4477aa")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # counts: never "0.2 files"


def _plain(x: float) -> str:
    """A number as a person writes it: 2,048, 0.5, 3e-07 (mathtext is off, so no 10^x)."""
    return f"{x:,.0f}" if abs(x) >= 1 and x == round(x) else f"{x:.3g}"


def _log_ticks(ax: Any) -> None:
    """Labels on a logarithmic axis, as many as fit: every tick within a decade, 1-2-5 within a few,
    the decades alone beyond (a minor tick label at each of 2..9 ran into its neighbours)."""
    from matplotlib.ticker import FuncFormatter

    def label(x: float, _: Any) -> str:
        lo, hi = sorted(ax.get_xlim())
        decades = np.log10(hi / lo) if lo > 0 else 99.0
        if decades <= 1.2:
            return _plain(x)
        lead = int(round(x / 10 ** np.floor(np.log10(x) + 1e-9))) if x > 0 else 0
        return _plain(x) if lead in ((1, 2, 5) if decades <= 2.5 else (1,)) else ""

    ax.xaxis.set_major_formatter(FuncFormatter(label))
    ax.xaxis.set_minor_formatter(FuncFormatter(label))


def scatter(name: str, *, title: str, x: np.ndarray, y: np.ndarray, xlabel: str, ylabel: str) -> Figure:
    """Points counted: many samples share a point (image sizes), so each distinct point is drawn once,
    its area by its count, and labelled with it when there are few."""
    pairs, counts = np.unique(np.stack([np.asarray(x, np.float64), np.asarray(y, np.float64)], axis=1), axis=0,
                              return_counts=True) if len(x) else (np.zeros((0, 2)), np.zeros(0, np.int64))

    def paint(fig: Any) -> None:
        ax = fig.add_subplot()
        area = 12 + 400 * np.sqrt(counts / counts.max()) if len(counts) else counts
        ax.scatter(pairs[:, 0], pairs[:, 1], s=area, alpha=0.5, color="#4477aa", edgecolors="#224466")
        if len(counts) <= 30:
            for (px, py), c in zip(pairs, counts):
                ax.annotate(f"{c:,}", (px, py), ha="center", va="center", fontsize=7)
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # pixels: never "38.5"
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set(title=f"{title}: {plural(len(x), 'sample')}, {len(counts):,} distinct (area: count)", xlabel=xlabel,
               ylabel=ylabel)

    return _draw(name, title, paint)


def per_index(name: str, *, title: str, values: Sequence[float], xlabel: str, ylabel: str,
              splits: Sequence[tuple[int, str]] | None = None) -> Figure:
    """A value per shard (tokens per shard, samples per shard): bars, or a line past 200 shards;
    ``splits``: (first index, split name) of each split, marked and labelled on the axis."""
    def paint(fig: Any) -> None:
        ax = fig.add_subplot()
        from matplotlib.ticker import MaxNLocator

        if len(values) <= 200:
            ax.bar(range(len(values)), values, color="#4477aa", width=0.9)
        else:
            ax.plot(range(len(values)), values, color="#4477aa", linewidth=0.8)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # shard numbers: never "2.5"
        for at, label in splits or ():  # where each split's shards begin
            ax.axvline(at - 0.5, color="#888888", linewidth=0.8, linestyle=":")
            ax.text(at - 0.4, 1.0, label, transform=ax.get_xaxis_transform(), va="top", fontsize=8, color="#555")
        ax.set(title=title, xlabel=xlabel, ylabel=ylabel)

    return _draw(name, title, paint)


def hist_grid(name: str, *, title: str, panels: list[tuple[str, np.ndarray, str]], ylabel: str = "count",
              cols: int = 3) -> Figure:
    """Small histograms side by side: ``(panel title, finite values, x label)`` each."""
    def draw(ax: Any, panel: tuple[str, np.ndarray, str]) -> None:
        head, v, xlabel = panel
        _hist_into(ax, np.asarray(v, np.float64), bins=40, log_x=False)
        _label(ax, head, xlabel, ylabel)

    return _grid(name, title=title, panels=panels, cols=cols, draw=draw)


def bar_grid(name: str, *, title: str, panels: list[tuple[str, list[str], np.ndarray, str]], ylabel: str,
             cols: int = 3) -> Figure:
    """Small bar charts side by side: ``(panel title, labels, values, x label)`` each (label balance)."""
    def draw(ax: Any, panel: tuple[str, list[str], np.ndarray, str]) -> None:
        head, labels, values, xlabel = panel
        ax.bar(range(len(values)), values, color="#4477aa")
        ax.set_xticks(range(len(labels)), [_short(s, 10) for s in labels], fontsize=6,
                      rotation=90 if len(labels) > 6 or max(map(len, labels), default=0) > 4 else 0)
        _label(ax, head, xlabel, ylabel)

    return _grid(name, title=title, panels=panels, cols=cols, draw=draw)


def _grid(name: str, *, title: str, panels: list[Any], cols: int, draw: Callable[[Any, Any], None]) -> Figure:
    cols = max(1, min(cols, len(panels)))
    rows = max(1, -(-len(panels) // cols))
    height = max(2.6, 2.1 * rows + 0.5)

    def paint(fig: Any) -> None:
        fig.suptitle(title)
        # fixed margins, in inches turned into fractions: room for the title, tick labels and axis labels
        fig.subplots_adjust(left=0.7 / SIZE[0], right=1 - 0.35 / SIZE[0], top=1 - 0.5 / height,
                            bottom=0.45 / height, wspace=0.35, hspace=0.75)
        axes = fig.subplots(rows, cols, squeeze=False)
        for ax, panel in zip(axes.flat, panels):
            draw(ax, panel)
        for ax in list(axes.flat)[len(panels):]:
            ax.set_axis_off()

    return _draw(name, title, paint, size=(SIZE[0], height), layout=None)


def _label(ax: Any, head: str, xlabel: str, ylabel: str) -> None:
    from matplotlib.ticker import ScalarFormatter

    if isinstance(ax.xaxis.get_major_formatter(), ScalarFormatter):  # whole values, no "+2.27e6" offset
        ax.xaxis.get_major_formatter().set_useOffset(False)
        ax.locator_params(axis="x", nbins=4)
    # a panel's title and label fit its width (a character is about 0.6 em), so neighbours never overlap
    inches = ax.get_position().width * ax.figure.get_figwidth()
    ax.set_title(_short(head, min(60, max(10, int(inches * 72 / (8 * 0.6))))), fontsize=8)
    ax.set_xlabel(_short(xlabel, min(50, max(10, int(inches * 72 / (7 * 0.6))))), fontsize=7)
    ax.set_ylabel(ylabel, fontsize=7)
    ax.tick_params(labelsize=6)


def _short(text: str, width: int = 24) -> str:
    text = str(text).replace("\n", " ")
    return text if len(text) <= width else text[:width - 1] + "…"
