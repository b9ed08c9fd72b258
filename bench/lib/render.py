"""What the report renderers share: reading nested report JSON, formatting numbers for Markdown,
writing JSON, and the axes of the plots (matplotlib, Agg, imported only when a plot is drawn)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Optional


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


def write_json(obj: Any, path: Path, indent: Optional[int] = 2) -> None:
    path.write_text(json.dumps(obj, indent=indent, ensure_ascii=False, default=str))


def render_files(
    report: dict,
    out: Path,
    to_markdown: Optional[Callable[[dict], str]],
    to_png: Optional[Callable[[dict, Path], None]] = None,
    png: str = "report.png",
) -> bool:
    """The plot, then report.md. A plot that fails is a warning of the report (the numbers matter
    more than the picture); True if one did."""
    failed = False
    if to_png is not None:
        try:
            to_png(report, out / png)
        except Exception as exc:  # noqa: BLE001
            report.setdefault("warnings", []).append(f"{png} failed: {exc!r}")
            failed = True
    if to_markdown is not None:
        (out / "report.md").write_text(to_markdown(report))
    return failed


def write_files(
    report: dict,
    out: Path,
    json_name: str,
    to_markdown: Optional[Callable[[dict], str]],
    to_png: Optional[Callable[[dict, Path], None]] = None,
    png: str = "report.png",
    indent: Optional[int] = 2,
) -> None:
    """The JSON first (whatever the renderers do), then ``render_files``; the JSON again if the
    plot failed (its warning)."""
    write_json(report, out / json_name, indent)
    if render_files(report, out, to_markdown, to_png, png):
        write_json(report, out / json_name, indent)


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot().close(fig)


def plain_log_axis(ax, x: bool = True, y: bool = False) -> None:
    from matplotlib.ticker import FuncFormatter, NullFormatter

    fmt_ = FuncFormatter(lambda v, _: f"{v:g}")
    if x:
        ax.xaxis.set_major_formatter(fmt_)
        ax.xaxis.set_minor_formatter(NullFormatter())
    if y:
        ax.yaxis.set_major_formatter(fmt_)
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if f"{v:g}"[0] in "25" else ""))


def legend(ax) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "not measured", ha="center", va="center", transform=ax.transAxes, color="gray")


def seconds_vs_clients(ax, title: str) -> None:
    """Log-log seconds vs concurrent clients, shared by the latency and TTFB panels."""
    ax.set_title(title)
    ax.set_xlabel("concurrent clients")
    ax.set_ylabel("seconds")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    plain_log_axis(ax, y=True)
    ax.grid(True, alpha=0.3, which="both")
    legend(ax)


def log2_panel(ax, title: str, xlabel: str, ylabel: str, ys: list) -> None:
    """Clients or batch size on a log2 axis, the quantity from 0 to a little above its largest value."""
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.set_xscale("log", base=2)
    plain_log_axis(ax)
    ax.set_ylim(0, 1.15 * max([y for y in ys if y is not None], default=1.0))
    ax.grid(True, alpha=0.3)
    legend(ax)


def by_clients(closed: dict, *keys: Any) -> list[tuple[int, Any]]:
    """(clients, value) of each closed-loop level that has the value, in order of clients."""
    pts = [(int(c), get(closed[c], *keys)) for c in sorted(closed, key=int)]
    return [p for p in pts if p[1] is not None]
