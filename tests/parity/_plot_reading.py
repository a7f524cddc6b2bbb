"""Reading the matrix's PNG plots back with PIL (not matplotlib, which drew them): each
datum is mapped to its pixel from the panel geometry the PNG carries, and the colour there
is compared with what the datum must look like (shared by the plot and matrix tests)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from matplotlib import colormaps
from matplotlib.colors import to_rgb
from PIL import Image

from bakery.parity import plots
from bakery.parity.plots import HeatRow


def png(path: Path) -> tuple[Image.Image, dict]:
    image = Image.open(path)
    assert image.format == "PNG"
    return image.convert("RGB"), json.loads(image.text[plots.METADATA_KEY])


def to_pixel(panel: dict, x: float, y: float) -> tuple[int, int]:
    left, top, right, bottom = panel["pixels"]
    (x0, x1), (y0, y1) = panel["xlim"], panel["ylim"]
    px = left + (x - x0) / (x1 - x0) * (right - left)
    py = bottom - (y - y0) / (y1 - y0) * (bottom - top)  # rows grow downwards
    return round(px), round(py)


def close(rgb: tuple[int, ...], color: str, tol: int = 8) -> bool:
    want = [round(c * 255) for c in to_rgb(color)]
    return all(abs(a - b) <= tol for a, b in zip(rgb, want, strict=True))


def bar_top(image: Image.Image, panel: dict, x: float, color: str) -> float:
    """The data value at the top edge of the bar of ``color`` at ``x`` (scanned upwards
    from the axis along the bar's centre column)."""
    column, axis = to_pixel(panel, x, panel["ylim"][0])
    y = axis - 3  # above the axis line and its antialiasing
    assert close(image.getpixel((column, y)), color), f"no bar of {color} at x={x}"
    while y > panel["pixels"][1] and close(image.getpixel((column, y)), color):
        y -= 1
    left, top, right, bottom = panel["pixels"]
    (y0, y1) = panel["ylim"]
    return y0 + (bottom - (y + 0.5)) / (bottom - top) * (y1 - y0)


def assert_bars(path: Path, panel: str, values: list[float], colors: list[str], xs=None):
    image, meta = png(path)
    where = meta["panels"][panel]
    span = where["ylim"][1] - where["ylim"][0]
    pixel = span / (where["pixels"][3] - where["pixels"][1])
    for i, (value, color) in enumerate(zip(values, colors, strict=True)):
        x = i if xs is None else xs[i]
        assert abs(bar_top(image, where, x, color) - value) <= 2 * pixel, (panel, i, value)


def assert_heatmap(path: Path, rows: list[HeatRow]) -> None:
    image, meta = png(path)
    panel = meta["panels"]["heatmap"]
    width = (panel["pixels"][2] - panel["pixels"][0]) / (panel["xlim"][1] - panel["xlim"][0])
    assert width >= 3, f"cells of {width:.1f} pixels cannot be read"
    vmax = max(d for r in rows for d in r.deltas if d is not None)
    table = np.array([colormaps["viridis"](i / 255)[:3] for i in range(256)]) * 255
    for r, row in enumerate(rows):
        for s, delta in enumerate(row.deltas):
            rgb = image.getpixel(to_pixel(panel, s, r))
            if row.fork_step is not None and s == row.fork_step:
                assert close(rgb, plots.FORK_COLOR), (row.case, s, rgb)
            elif row.fork_step is not None and s > row.fork_step:
                assert close(rgb, plots.AFTER_FORK_COLOR), (row.case, s, rgb)
            else:
                assert delta is not None
                nearest = int(np.argmin(((table - np.array(rgb)) ** 2).sum(axis=1)))
                assert abs(nearest / 255 * vmax - delta) <= vmax / 64, (row.case, s, delta)
