"""Preflight probe, run by the serving Python with the serving env (stdlib + vllm only).

usage: python -c "$(cat probe.py)" MODULE ARG...   (preflight runs it so)

It answers, as one JSON line on stdout after the marker ``BAKERY_PROBE``
(vLLM may log to stdout too): where ``vllm`` was imported from, the
vLLM and torch versions, whether ``ray`` is importable, and whether vLLM's own
argument parser for MODULE (the API server's ``make_arg_parser``, or the CLI's
``serve`` subparser for a headless node) accepts ARG...; when it does, the
parsed parallel values, so the launcher can see an extra arg contradict its own.
It must not import bakery: the serving Python may not have it.
"""

import contextlib
import importlib.util
import io
import json
import sys

MARKER = "BAKERY_PROBE"
# The parsed values preflight checks (bakery.launch.vllm_args reads the same
# keys when this parser cannot be built).
FIELDS = (
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "decode_context_parallel_size",
    "cp_kv_cache_interleave_size",
    "dcp_kv_cache_interleave_size",
    "prefill_context_parallel_size",
    "speculative_config",
    "spec_method",
    "spec_model",
    "spec_tokens",
    "revision",
    "distributed_executor_backend",
    "nnodes",
    "node_rank",
    # DCP features the series refuses or takes from the launcher (checks.py)
    "dcp_comm_backend",
    "dcp_q_replicate",
    "swa_bounded_replay",
    "enable_dbo",
    "ubatch_size",
)


def _parser(module):
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    if module == "vllm.entrypoints.cli.main":
        return make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
    return make_arg_parser(FlexibleArgumentParser(prog=module))


def _parse(module, args):
    if module == "vllm.entrypoints.cli.main":
        args = args[1:]  # drop the "serve" subcommand word
    try:
        parser = _parser(module)
    except Exception as exc:  # reported, not swallowed: it is the answer
        return {"ok": False, "stage": "parser", "error": f"{type(exc).__name__}: {exc}"}
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            namespace = parser.parse_args(args)
    except SystemExit:
        lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
        return {"ok": False, "stage": "args", "error": lines[-1] if lines else "rejected"}
    except Exception as exc:  # a flag value vLLM's own type check refuses
        return {"ok": False, "stage": "args", "error": f"{type(exc).__name__}: {exc}"}
    return {"ok": True, "parsed": {k: getattr(namespace, k, None) for k in FIELDS}}


def main(argv):
    """Print the answer (bakery.launch.host.ProbeAnswer reads it), its keys in this order."""
    module, args = argv[0], argv[1:]
    try:
        import vllm
    except Exception as exc:  # reported: it is the answer
        error = f"{type(exc).__name__}: {exc}"
        unknown = {"vllm_file": None, "vllm_version": None, "torch_version": None}
        print(MARKER, json.dumps({**unknown, "import_error": error}))
        return 0
    ray = importlib.util.find_spec("ray") is not None
    with contextlib.redirect_stdout(io.StringIO()):
        parsed = _parse(module, args)
    answer = {
        "vllm_file": vllm.__file__,
        "vllm_version": getattr(vllm, "__version__", None),
        "torch_version": getattr(sys.modules.get("torch"), "__version__", None),
        "ray": ray,
        "args": parsed,
    }
    print(MARKER, json.dumps(answer, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
