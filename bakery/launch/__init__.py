"""The launcher: serve exactly the baked tree, refuse what cannot work, leave a record.

Job: turn a profile (``launcher/dcp2/profiles/*.toml``) plus flags into one vLLM
command (``python -m vllm.entrypoints.openai.api_server``, or vLLM's own
``serve --headless`` on a worker node), check it before anything heavy starts,
run it in its own process group, record the run under ``artifacts/dcp2/`` and
stop it again. Boundary: it reads the series (stage table, pins, BAKED.json)
and the baked tree, never writes them; it never bakes; multi-node work is
vLLM's own (``--nnodes``/``--node-rank``/``--master-addr`` or Ray), not ours.

Modules: ``gates`` (the stage table from stages.toml), ``profiles`` (profile
files and flag overrides), ``plan`` (the command and env), ``preflight`` (every
refusal, all reported in one run: pure rules in ``checks``, host facts in ``host``,
``model_config`` and ``vllm_args``; the installed wheel in ``installed``), ``doctor``
(host checks without a profile), ``lifecycle`` (start/stop/status; ``bakery.parity`` starts
its matrix's servers through it),
``run_record`` (the record each run leaves, read back by stop/status/logs),
``processes`` (process groups and run markers), and two stdlib-only scripts run by the serving
Python: ``probe`` (where vllm imports from, does it accept the flags) and
``keeper`` (holds the process group, tears it down when the launcher dies).
"""

from bakery.launch.errors import LaunchError, PreflightError, ProfileError

__all__ = ["LaunchError", "PreflightError", "ProfileError"]
