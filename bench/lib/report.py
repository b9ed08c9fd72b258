"""The one report writer of the bench: every runner describes its report, this module writes it.

A report is its JSON (everything measured) and two views built from the JSON alone: the Markdown
(``Doc``: a title, the command, lines and ``Table``s of ``Col``s) and, where there is one, the plot
(``Figure``: ``Panel``s of ``Series``, drawn by matplotlib). ``Kind`` names the files and writes
them, so ``python -m bench report`` renders a committed run again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence, Union

# ---------------------------------------------------------------------------------- values


def get(d: Any, *keys: Any) -> Any:
    """``d[k1][k2]...`` with every key as a string (JSON objects), None where anything is missing."""
    for k in keys:
        if d is None:
            return None
        d = d.get(str(k)) if isinstance(d, dict) else None
    return d


def fmt(x: Any, nd: int = 2) -> str:
    """A table cell: ``–`` for None, floats to ``nd`` decimals."""
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    return str(x)


def ms(x: Optional[float]) -> Optional[float]:
    """Seconds to milliseconds, None kept (a percentile of nothing)."""
    return x and 1000 * x


def by_clients(closed: dict, *keys: Any) -> list[tuple[int, Any]]:
    """(clients, value) of each closed-loop level that has the value, in order of clients."""
    pts = [(int(c), get(closed[c], *keys)) for c in sorted(closed, key=int)]
    return [p for p in pts if p[1] is not None]


def json_text(obj: Any, indent: Optional[int] = 2) -> str:
    return json.dumps(obj, indent=indent, ensure_ascii=False, default=str)


def write_json(obj: Any, path: Path, indent: Optional[int] = 2) -> None:
    path.write_text(json_text(obj, indent))


# ---------------------------------------------------------------------------------- Markdown


@dataclass(frozen=True)
class Col:
    """One column: its header, the value (a key of the row, an index of a tuple row, a path of keys,
    or a function of the row, which may return the cell's text), floats to ``nd`` decimals,
    right-aligned or not."""

    header: str
    value: Union[str, int, tuple, Callable[[Any], Any]]
    nd: int = 2
    right: bool = False

    def cell(self, row: Any) -> str:
        if callable(self.value):
            v = self.value(row)
        elif isinstance(self.value, tuple) and isinstance(row, (tuple, list)):
            v = get(row[self.value[0]], *self.value[1:])  # (index of the tuple row, keys...)
        elif isinstance(self.value, tuple):
            v = get(row, *self.value)
        elif isinstance(self.value, int):
            v = row[self.value]
        else:
            v = row.get(self.value)
        return fmt(v, self.nd)


@dataclass
class Table:
    columns: Sequence[Col]
    rows: Iterable[Any]

    def lines(self) -> list[str]:
        cols = list(self.columns)
        out = ["| " + " | ".join(c.header for c in cols) + " |"]
        out.append("|" + "".join("---:|" if c.right else "---|" for c in cols))
        out += ["| " + " | ".join(c.cell(r) for c in cols) + " |" for r in self.rows]
        return out


def load_columns(ttfb: Sequence[str] = ("p50", "p95"), latency: Sequence[str] = ("p50", "p95", "p99")) -> list[Col]:
    """The columns of a load phase (``loadgen.summarize``) in a row ``(name, clients, summary)``,
    after the row's name: its throughput, the chosen TTFB and latency percentiles, the requests
    done / failed / cut and the mean batch."""
    return [
        Col("clients", 1),
        Col("audio s/s", (2, "audio_s_per_s"), nd=3),
        Col("req/s", (2, "requests_per_s"), nd=3),
        *[Col(f"TTFB {q}", (2, "ttfb_s", q)) for q in ttfb],
        *[Col(f"lat {q}", (2, "latency_s", q)) for q in latency],
        *[
            Col(h, lambda x, k=k: str(x[2].get(k)))
            for h, k in (("done", "completed"), ("errors", "errors"), ("cut", "cut"))
        ],
        Col("mean batch", (2, "engine", "mean_rows_per_step")),
    ]


Block = Union[str, Table, None]


@dataclass
class Doc:
    """A report's Markdown: ``# title``, the command in backquotes, then each block (a line of
    text, or a table); None blocks are skipped, so a section that was not measured is just None."""

    title: str
    command: Optional[str] = None
    blocks: list[Block] = field(default_factory=list)
    end: str = "\n"

    def add(self, *blocks: Block) -> "Doc":
        self.blocks += blocks
        return self

    def table(self, columns: Sequence[Col], rows: Iterable[Any], before: Sequence[str] = ("",)) -> "Doc":
        """A table, after the ``before`` lines (by default one empty line)."""
        self.blocks += [*before, Table(columns, rows)]
        return self

    def markdown(self) -> str:
        lines = [f"# {self.title}", ""]
        if self.command is not None:
            lines += [f"`{self.command}`", ""]
        for b in self.blocks:
            if isinstance(b, Table):
                lines += b.lines()
            elif b is not None:
                lines.append(b)
        return "\n".join(lines) + self.end


def target(value: Any, op: str, threshold: float) -> dict:
    """A figure against its target (``op`` ``>=`` or ``<=``): its value, the target and whether
    it is met (None: not measured)."""
    met = None if value is None else (value >= threshold if op == ">=" else value <= threshold)
    return {"value": value, "target": f"{op} {threshold}", "met": met}


# The targets' table of a runner whose report keeps them as ``{name: target(...)}``.
TARGETS = [
    Col("target", lambda x: f"{x[0]} {x[1]['target']}"),
    Col("value", lambda x: str(x[1]["value"])),
    Col("met", lambda x: "–" if x[1]["met"] is None else str(x[1]["met"])),
]


def failed(report: dict, note: str = "") -> Optional[str]:
    """The line that says a run failed (a report written on an error keeps what it measured)."""
    return f"**The run failed:** `{report['error']}`{note}" if report.get("error") else None


# ---------------------------------------------------------------------------------- plots


@dataclass
class Series:
    """One thing drawn on a panel: a line (``style`` is matplotlib's fmt string), bars, or a
    horizontal rule at ``y``. ``kw`` goes to matplotlib as it is (color, alpha, lw, width...)."""

    kind: str
    x: Any = None
    y: Any = None
    label: Optional[str] = None
    style: str = ""
    kw: dict = field(default_factory=dict)


def line(x: Sequence, y: Sequence, label: Optional[str] = None, style: str = "o-", **kw: Any) -> Series:
    return Series("line", list(x), list(y), label, style, kw)


def points(pts: Sequence[tuple], label: Optional[str] = None, style: str = "o-", **kw: Any) -> Optional[Series]:
    """A line through (x, y) points, None when there are none (nothing drawn, nothing in the legend)."""
    return line([p[0] for p in pts], [p[1] for p in pts], label, style, **kw) if pts else None


def bars(x: Sequence, y: Sequence, label: Optional[str] = None, **kw: Any) -> Series:
    return Series("bar", list(x), list(y), label, "", kw)


@dataclass
class Panel:
    title: str = ""
    xlabel: str = ""
    ylabel: str = ""
    series: list = field(default_factory=list)
    log2x: bool = False  # clients or batch sizes: log2, numbers as they are
    logy: bool = False
    ylim: Optional[tuple] = None  # (bottom, top); either may be None
    xlim: Optional[tuple] = None
    grid: Optional[str] = "both"  # "both", or None
    legend: Optional[dict] = field(default_factory=lambda: {"fontsize": 8})  # None: no legend
    not_measured: bool = True  # an empty panel says so
    tick_size: Optional[int] = None
    twin: Optional["Panel"] = None  # a second y axis on the right

    def add(self, *series: Optional[Series]) -> "Panel":
        self.series += [s for s in series if s is not None]
        return self


def log2_panel(title: str, xlabel: str, ylabel: str, series: Sequence[Optional[Series]], **kw: Any) -> Panel:
    """Clients or batch size on a log2 axis, the quantity from 0 to a little above its largest value."""
    ys = [y for s in series if s is not None for y in s.y if y is not None]
    return Panel(title, xlabel, ylabel, log2x=True, ylim=(0, 1.15 * max(ys, default=1.0)), **kw).add(*series)


def seconds_panel(title: str, series: Sequence[Optional[Series]]) -> Panel:
    """Log-log seconds vs concurrent clients (the latency and TTFB panels)."""
    return Panel(title, "concurrent clients", "seconds", log2x=True, logy=True).add(*series)


@dataclass
class Figure:
    panels: list[Panel]
    shape: tuple[int, int] = (1, 1)
    size: tuple[float, float] = (8, 4)
    title: Optional[str] = None


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _plain_log_axis(ax, x: bool = True, y: bool = False) -> None:
    from matplotlib.ticker import FuncFormatter, NullFormatter

    plain = FuncFormatter(lambda v, _: f"{v:g}")
    if x:
        ax.xaxis.set_major_formatter(plain)
        ax.xaxis.set_minor_formatter(NullFormatter())
    if y:
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if f"{v:g}"[0] in "25" else ""))


def _series(ax, s: Series) -> None:
    label = {"label": s.label} if s.label is not None else {}
    if s.kind == "line":
        ax.plot(s.x, s.y, *([s.style] if s.style else []), **label, **s.kw)
    elif s.kind == "bar":
        ax.bar(s.x, s.y, **label, **s.kw)
    elif s.kind == "hline":
        ax.axhline(s.y, **label, **s.kw)
    else:
        raise ValueError(f"unknown series kind {s.kind!r}")


def _panel(ax, p: Panel) -> None:
    for s in p.series:
        _series(ax, s)
    if p.twin is not None and p.twin.series:
        twin = ax.twinx()
        _panel(twin, p.twin)
    ax.set(title=p.title, xlabel=p.xlabel, ylabel=p.ylabel)
    if p.log2x:
        ax.set_xscale("log", base=2)
    if p.logy:
        ax.set_yscale("log")
    if p.log2x:
        _plain_log_axis(ax, y=p.logy)
    if p.tick_size:
        ax.tick_params(axis="x", labelsize=p.tick_size)
    if p.ylim is not None:
        ax.set_ylim(*p.ylim)
    if p.xlim is not None:
        ax.set_xlim(*p.xlim)
    if p.grid is not None:
        ax.grid(True, alpha=0.3, which="both" if p.logy else "major")
    if p.legend is not None:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(**p.legend)
        elif p.not_measured:
            ax.text(0.5, 0.5, "not measured", ha="center", va="center", transform=ax.transAxes, color="gray")


def draw(fig_spec: Figure, path: Path) -> None:
    plt = pyplot()
    rows, cols = fig_spec.shape
    fig, axes = plt.subplots(rows, cols, figsize=fig_spec.size, squeeze=False)
    for ax, p in zip([a for row in axes for a in row], fig_spec.panels):
        _panel(ax, p)
    if fig_spec.title:
        fig.suptitle(fig_spec.title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------------------- files


@dataclass(frozen=True)
class Kind:
    """What a runner's report is made of: its JSON file's name, its Markdown and its plot (each a
    function of the report; no plot: None) and the JSON's indent. The plot is report.png."""

    json_name: str
    doc: Callable[[dict], Doc]
    figure: Optional[Callable[[dict], Optional[Figure]]] = None
    indent: Optional[int] = 2

    def markdown(self, report: dict) -> str:
        return self.doc(report).markdown()

    def render(self, report: dict, out: Path) -> bool:
        """The plot, then report.md. A plot that fails is a warning of the report (the numbers
        matter more than the picture); True if one did."""
        failed_plot = False
        if self.figure is not None:
            try:
                spec = self.figure(report)
                if spec is not None:
                    draw(spec, out / "report.png")
            except Exception as exc:  # noqa: BLE001
                report.setdefault("warnings", []).append(f"report.png failed: {exc!r}")
                failed_plot = True
        (out / "report.md").write_text(self.markdown(report))
        return failed_plot

    def write(self, report: dict, out: Path) -> None:
        """The JSON first (whatever the views do), then the views; the JSON again if the plot
        failed (its warning)."""
        write_json(report, out / self.json_name, self.indent)
        if self.render(report, out):
            write_json(report, out / self.json_name, self.indent)
