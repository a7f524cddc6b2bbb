"""The vLLM flags preflight checks, read without vLLM when its own parser cannot be built.

vLLM's parser (run by the probe in the serving Python) is the authority: when
it answers, its parsed values are used. On a host where it cannot be built
(the default base needs its GPUs to infer a device) this reader takes the same
few flags from the same argument list, with vLLM's spellings: long names with
``-`` or ``_``, ``--flag=value``, the short forms (``-tp``, ``-dcp``,
``-pcp``, ``-sc``), and dotted JSON keys (``--speculative-config.method mtp``).
The keys are the probe's (``probe.FIELDS``), so either source feeds the checks.
"""

from __future__ import annotations

import argparse
import json
import re
from typing import Any

import msgspec

from bakery.launch import probe

__all__ = ["read_args", "ArgValueError", "VllmArgs"]

_UNDERSCORES = re.compile(r"(?<=^--)[^.=]*")
_SHORT = {
    "tensor_parallel_size": ("-tp",),
    "pipeline_parallel_size": ("-pp",),
    "decode_context_parallel_size": ("-dcp",),
    "prefill_context_parallel_size": ("-pcp",),
    "speculative_config": ("-sc",),
}
_INTS = {
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "decode_context_parallel_size",
    "cp_kv_cache_interleave_size",
    "dcp_kv_cache_interleave_size",
    "prefill_context_parallel_size",
    "nnodes",
    "node_rank",
    "spec_tokens",
    "ubatch_size",
}
# vLLM's bool fields are BooleanOptionalAction flags: --name and --no-name.
_BOOLS = {"dcp_q_replicate", "swa_bounded_replay", "enable_dbo"}


class VllmArgs(msgspec.Struct, frozen=True):
    """The vLLM flags preflight checks (``probe.FIELDS``, in that order), as vLLM's parser
    (the probe) or ``read_args`` read them; None: not given (vLLM's default). The types
    are what vLLM's parser gives; its values are taken as given, not checked."""

    tensor_parallel_size: int | None = None
    pipeline_parallel_size: int | None = None
    decode_context_parallel_size: int | None = None
    cp_kv_cache_interleave_size: int | None = None
    dcp_kv_cache_interleave_size: int | None = None
    prefill_context_parallel_size: int | None = None
    speculative_config: dict[str, Any] | str | None = None
    spec_method: str | None = None
    spec_model: str | None = None
    spec_tokens: int | None = None
    revision: str | None = None
    distributed_executor_backend: str | None = None
    nnodes: int | None = None
    node_rank: int | None = None
    dcp_comm_backend: str | None = None
    dcp_q_replicate: bool | None = None
    swa_bounded_replay: bool | None = None
    enable_dbo: bool | None = None
    ubatch_size: int | None = None

    def over(self, parsed: dict[str, Any]) -> VllmArgs:
        """These args with ``parsed``'s values (vLLM's parse, by field name) over them: a
        field ``parsed`` lacks keeps this reading."""
        return msgspec.structs.replace(self, **parsed)


class ArgValueError(ValueError):
    """A flag value vLLM's own type check would refuse (an int that is not one, bad JSON)."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    for key in probe.FIELDS:
        flag = "--" + key.replace("_", "-")
        if key in _BOOLS:
            parser.add_argument(flag, dest=key, action=argparse.BooleanOptionalAction)
        else:
            parser.add_argument(flag, *_SHORT.get(key, ()), dest=key)
    return parser


def _normalise(args: list[str]) -> tuple[list[str], set[str]]:
    """vLLM's spelling rules: ``_`` as ``-`` in long names; dotted keys set a JSON field."""
    out, dotted = [], set()
    for arg in args:
        if arg.startswith("--"):
            arg = _UNDERSCORES.sub(lambda m: m.group(0).replace("_", "-"), arg, count=1)
            name = arg[2:].split("=", 1)[0]
            if "." in name:
                dotted.add(name.split(".", 1)[0].replace("-", "_"))
        out.append(arg)
    return out, dotted


def read_args(args: list[str]) -> VllmArgs:
    """The probe's fields from ``args`` (the last occurrence wins, as in argparse)."""
    normalised, dotted = _normalise(list(args))
    try:
        namespace, _ = _parser().parse_known_args(normalised)
    except argparse.ArgumentError as exc:
        raise ArgValueError(str(exc)) from None
    parsed: dict[str, Any] = {}
    for key in probe.FIELDS:
        value = getattr(namespace, key)
        if value is not None and key in _INTS:
            try:
                value = int(value)
            except ValueError:
                flag = "--" + key.replace("_", "-")
                raise ArgValueError(f"{flag} is not an integer: {value!r}") from None
        elif value is not None and key == "speculative_config":
            try:
                value = json.loads(value)
            except ValueError:
                raise ArgValueError(f"--speculative-config is not JSON: {value!r}") from None
        parsed[key] = value
    for key in dotted & set(probe.FIELDS):
        parsed[key] = parsed[key] or {"(dotted keys)": True}
    return VllmArgs(**parsed)
