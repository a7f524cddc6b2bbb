"""The matrix's pictures, as PNG (matplotlib, Agg): KV tokens per entry against the DCP1
baseline, the benchmark's latencies and throughput, and per candidate a parity heatmap of
cases × decode steps.

Each PNG carries, in a ``bakery`` text chunk, where each panel sits in pixels and the data
limits of its axes (``panels``: ``[left, top, right, bottom]`` pixels from the top-left
corner, ``xlim``, ``ylim``), so a reader can map any datum to its pixel and check the
picture against the numbers. Pure in, one file out; matplotlib is imported on use (the
``plots`` extra).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from bakery.tree import write_atomic

if TYPE_CHECKING:
    from bakery.parity.serving import BenchFigures

__all__ = ["HeatRow", "kv_plot", "bench_plot", "parity_heatmap", "available", "METADATA_KEY"]

METADATA_KEY = "bakery"
BASELINE_COLOR = "#7f7f7f"
CANDIDATE_COLOR = "#1f77b4"
P99_COLOR = "#ff7f0e"
FORK_COLOR = "#d62728"  # the first divergence's cell
AFTER_FORK_COLOR = "#d9d9d9"  # steps after it: the runs condition on different text
NO_STEP_COLOR = "#ffffff"  # a case that generated fewer steps
HEAT_CMAP = "viridis"
DPI = 100


def available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _figure(width: float, height: float):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=DPI)


def _panel(fig, ax) -> dict[str, Any]:
    box = ax.get_window_extent()
    height = fig.bbox.height
    return {
        "pixels": [box.x0, height - box.y1, box.x1, height - box.y0],
        "xlim": list(ax.get_xlim()),
        "ylim": list(ax.get_ylim()),
    }


def _save(fig, axes: dict[str, Any], path: Path, extra: dict[str, Any]) -> Path:
    import io

    fig.canvas.draw()  # final layout, so the panels' pixels are where they are drawn
    meta = {"panels": {name: _panel(fig, ax) for name, ax in axes.items()}, **extra}
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, metadata={METADATA_KEY: json.dumps(meta)})
    write_atomic(path, buffer.getvalue())
    return path


def _bars(ax, names: Sequence[str], values: Sequence[float | None], colors: Sequence[str]):
    shown = [v if v is not None and math.isfinite(v) else 0.0 for v in values]
    ax.bar(range(len(names)), shown, color=colors, width=0.6)
    ax.set_xticks(range(len(names)), names, rotation=20, ha="right", fontsize=8)
    ax.set_xlim(-0.6, len(names) - 0.4)
    ax.set_ylim(0, max(shown, default=0) * 1.18 or 1.0)


def kv_plot(names: Sequence[str], tokens: Sequence[int | None], baseline: str, path: Path) -> Path:
    """KV cache tokens per entry, the baseline grey, each bar labelled with its ratio."""
    fig = _figure(6.4, 3.8)
    ax = fig.add_subplot()
    colors = [BASELINE_COLOR if n == baseline else CANDIDATE_COLOR for n in names]
    _bars(ax, names, [None if t is None else float(t) for t in tokens], colors)
    base = dict(zip(names, tokens, strict=True)).get(baseline)
    for i, value in enumerate(tokens):
        if value is not None and base:
            ax.annotate(
                f"{value:,}\n×{value / base:.3f}",
                (i, value),
                ha="center",
                va="bottom",
                fontsize=7,
                xytext=(0, 2),
                textcoords="offset points",
            )
    ax.set_ylabel("KV cache tokens (vLLM's startup log)")
    ax.set_title(f"KV capacity per entry against {baseline}", fontsize=10)
    fig.tight_layout()
    return _save(fig, {"kv": ax}, path, {"names": list(names), "values": list(tokens)})


def bench_plot(names: Sequence[str], figures: Sequence[BenchFigures | None], path: Path) -> Path:
    """TTFT and ITL (p50 and p99 side by side) and output throughput per entry."""
    fig = _figure(10.5, 3.8)
    ttft, itl, by_throughput = fig.subplots(1, 3)
    axes = {"ttft": ttft, "itl": itl, "throughput": by_throughput}

    def value(i: int, key: str) -> float | None:
        entry = figures[i]
        return None if entry is None else getattr(entry, key)

    for panel, unit in (("ttft", "TTFT"), ("itl", "ITL")):
        ax = axes[panel]
        for offset, pct, color in ((-0.2, "p50", CANDIDATE_COLOR), (0.2, "p99", P99_COLOR)):
            shown = [value(i, f"{panel}_ms_{pct}") or 0.0 for i in range(len(names))]
            ax.bar(
                [i + offset for i in range(len(names))], shown, width=0.4, color=color, label=pct
            )
        top = max((value(i, f"{panel}_ms_p99") or 0.0 for i in range(len(names))), default=0)
        ax.set_ylim(0, top * 1.15 or 1.0)
        ax.set_ylabel(f"{unit} (ms)")
        ax.legend(fontsize=7)
    throughput = [value(i, "output_tok_s") for i in range(len(names))]
    _bars(by_throughput, names, throughput, [CANDIDATE_COLOR] * len(names))
    by_throughput.set_ylabel("output tokens/s")
    for panel in ("ttft", "itl"):
        axes[panel].set_xticks(range(len(names)), names, rotation=20, ha="right", fontsize=8)
        axes[panel].set_xlim(-0.6, len(names) - 0.4)
    fig.suptitle("vllm bench serve per entry", fontsize=10)
    fig.tight_layout()
    extra = {
        "names": list(names),
        "values": [msgspec.structs.asdict(f) if f else None for f in figures],
    }
    return _save(fig, axes, path, extra)


@dataclass(frozen=True)
class HeatRow:
    """One case of the heatmap: its |Δ chosen logprob| per step (None: no common token)."""

    case: str
    prompt_tokens: int | None
    deltas: tuple[float | None, ...]
    fork_step: int | None


def _cell_colors(rows: Sequence[HeatRow], steps: int, vmax: float):
    import numpy as np
    from matplotlib import colormaps
    from matplotlib.colors import to_rgba

    cmap = colormaps[HEAT_CMAP]
    image = np.ones((len(rows), max(steps, 1), 4))
    for r, row in enumerate(rows):
        for s in range(steps):
            delta = row.deltas[s] if s < len(row.deltas) else None
            if row.fork_step is not None and s == row.fork_step:
                image[r, s] = to_rgba(FORK_COLOR)
            elif row.fork_step is not None and s > row.fork_step:
                image[r, s] = to_rgba(AFTER_FORK_COLOR)
            elif delta is None or not math.isfinite(delta):
                image[r, s] = to_rgba(NO_STEP_COLOR)
            else:
                image[r, s] = cmap(min(delta / vmax, 1.0))
    return image


def parity_heatmap(
    rows: Sequence[HeatRow], path: Path, *, title: str, boundaries: Sequence[int] = ()
) -> Path:
    """Cases (ordered as given: by prompt length) × decode steps, coloured by |Δ chosen
    logprob| (viridis from 0 to ``vmax``); the first divergence red, the steps after it
    light grey; a dashed line where the prompt length crosses a page or shard boundary."""
    from matplotlib import colormaps
    from matplotlib.colors import Normalize

    steps = max((len(r.deltas) for r in rows), default=0)
    known = [d for r in rows for d in r.deltas if d is not None and math.isfinite(d)]
    vmax = max(known, default=0.0) or 1e-6
    # At least 5 pixels a step (up to 1000 steps), so every cell stays readable.
    fig = _figure(min(max(7.5, 3.5 + 0.05 * steps), 53.5), 1.6 + 0.28 * max(len(rows), 1))
    ax = fig.add_subplot()
    image = _cell_colors(rows, steps, vmax)
    ax.imshow(
        image,
        aspect="auto",
        interpolation="nearest",
        extent=(-0.5, max(steps, 1) - 0.5, len(rows) - 0.5, -0.5),
    )
    labels = [
        f"{r.case.removeprefix('completion_')} "
        f"({r.prompt_tokens if r.prompt_tokens is not None else '?'} tok)"
        for r in rows
    ]
    ax.set_yticks(range(len(rows)), labels, fontsize=7)
    ax.set_xlabel("decode step")
    ax.set_title(title, fontsize=9)
    lengths = [r.prompt_tokens or 0 for r in rows]
    for bound in boundaries:
        for i in range(1, len(rows)):
            if lengths[i - 1] <= bound < lengths[i]:
                ax.axhline(i - 0.5, color="white", linestyle="--", linewidth=1.2)
    scale = fig.colorbar(
        _mappable(colormaps[HEAT_CMAP], Normalize(0, vmax)), ax=ax, fraction=0.04, pad=0.02
    )
    scale.set_label("|Δ chosen logprob| (nats)", fontsize=7)
    fig.tight_layout()
    extra = {
        "cases": [r.case for r in rows],
        "steps": steps,
        "vmax": vmax,
        "cmap": HEAT_CMAP,
        "fork_steps": [r.fork_step for r in rows],
    }
    return _save(fig, {"heatmap": ax}, path, extra)


def _mappable(cmap, norm):
    from matplotlib.cm import ScalarMappable

    return ScalarMappable(norm=norm, cmap=cmap)
