"""The matrix's PNG plots, read back with PIL (not matplotlib, which drew them): each panel's
pixels must show the numbers it was given.

The writer records in the PNG's ``bakery`` text chunk where each panel sits and its data
limits; these tests map every datum to its pixel themselves and read the colour there:
a bar's top edge (its height in pixels against the axis), a heatmap cell's colour against
the colormap's own table, the first divergence red, the steps after it grey. Each check is
also run on a plot drawn from planted wrong data, to show it fails.
"""

from __future__ import annotations

import pytest
from _plot_reading import assert_bars, assert_heatmap, png

from bakery.parity import plots
from bakery.parity.plots import HeatRow
from bakery.parity.serving import BenchFigures


def test_kv_plot_bars_are_the_kv_tokens(tmp_path):
    names, tokens = ["dcp1", "dcp2-a2a", "dcp2-ag_rs"], [29133, 29566, 58000]
    path = plots.kv_plot(names, tokens, "dcp1", tmp_path / "kv.png")
    colors = [plots.BASELINE_COLOR, plots.CANDIDATE_COLOR, plots.CANDIDATE_COLOR]
    assert_bars(path, "kv", tokens, colors)
    # planted: a plot of other numbers does not pass for these
    wrong = plots.kv_plot(names, [29133, 58000, 29566], "dcp1", tmp_path / "wrong.png")
    with pytest.raises(AssertionError):
        assert_bars(wrong, "kv", tokens, colors)


def test_bench_plot_panels_are_the_bench_figures(tmp_path):
    figures = [
        {"ttft_ms_p50": 40.0, "ttft_ms_p99": 90.0, "itl_ms_p50": 5.0, "itl_ms_p99": 9.0,
         "output_tok_s": 300.0},
        {"ttft_ms_p50": 60.0, "ttft_ms_p99": 120.0, "itl_ms_p50": 4.0, "itl_ms_p99": 12.0,
         "output_tok_s": 450.0},
    ]  # fmt: skip
    benched = [BenchFigures(**f) for f in figures]
    path = plots.bench_plot(["dcp1", "dcp2"], benched, tmp_path / "bench.png")
    for panel in ("ttft", "itl"):
        for offset, pct, color in ((-0.2, "p50", plots.CANDIDATE_COLOR),
                                   (0.2, "p99", plots.P99_COLOR)):  # fmt: skip
            values = [f[f"{panel}_ms_{pct}"] for f in figures]
            assert_bars(path, panel, values, [color] * 2, xs=[0 + offset, 1 + offset])
    assert_bars(path, "throughput", [300.0, 450.0], [plots.CANDIDATE_COLOR] * 2)
    swapped = plots.bench_plot(["dcp1", "dcp2"], benched[::-1], tmp_path / "swapped.png")
    with pytest.raises(AssertionError):
        assert_bars(swapped, "throughput", [300.0, 450.0], [plots.CANDIDATE_COLOR] * 2)


ROWS = [
    HeatRow("short", 12, (0.0, 0.01, 0.02, 0.0, 0.0), None),
    HeatRow("page", 129, (0.0, 0.05, None, None, None), 2),
    HeatRow("shard", 257, (0.2, 0.1, 0.0, 0.15, None), 4),
]


def test_parity_heatmap_cells_are_the_deltas_and_the_fork_is_marked(tmp_path):
    path = plots.parity_heatmap(ROWS, tmp_path / "heat.png", title="t", boundaries=[128, 256])
    assert_heatmap(path, ROWS)
    image, meta = png(path)
    assert meta["cases"] == ["short", "page", "shard"] and meta["steps"] == 5
    # planted: the fork drawn one step late, and the rows in another order
    late = [HeatRow(r.case, r.prompt_tokens, r.deltas, r.fork_step and r.fork_step + 1)
            for r in ROWS]  # fmt: skip
    bad = plots.parity_heatmap(late, tmp_path / "late.png", title="t")
    with pytest.raises(AssertionError):
        assert_heatmap(bad, ROWS)
    shuffled = plots.parity_heatmap(ROWS[::-1], tmp_path / "shuffled.png", title="t")
    with pytest.raises(AssertionError):
        assert_heatmap(shuffled, ROWS)
