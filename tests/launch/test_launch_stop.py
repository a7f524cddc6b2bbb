"""``stop`` ends every process the launcher started, and nothing else; bad launcher input.

Fast: the "server" is a shell under the real keeper, spawned by the launcher's
own ``_spawn`` and recorded by its own ``_write_pid``, so the pid file, the
process group and the run marker are exactly what ``start`` leaves. What is
alive afterwards is read from /proc directly (``_launch_support.marked`` reads
the environment; ``ps``-style checks read /proc/<pid>/stat), not through the
code under test.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from _launch_support import PROFILES, PYTHON, REPO, SERIES, launched_in, marked, wait_until

from bakery.cli.launch import main
from bakery.launch import lifecycle, processes, run_record
from bakery.launch.gates import load_gate_table
from bakery.launch.plan import make_plan
from bakery.launch.profiles import load_profile


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def run(art, shell: str, profile: str = "cpu-tiny"):
    """One recorded run whose server is ``sh -c shell``: (record, keeper, run folder). Its
    processes are followed by the run folder, never by the run id (profile/UTC second),
    which a run of another test or checkout in the same second shares: the dead-leader test
    counted such a run's processes as its own and failed under load."""
    plan = make_plan(
        load_profile(profile, PROFILES, load_gate_table(SERIES)),
        python=PYTHON,
        tree=REPO / "build" / "baked-cpu",
        root=REPO,
        artifacts=art,
    )
    plan = dataclasses.replace(plan, command=("/bin/sh", "-c", shell))
    record = run_record.new_record(plan)
    proc, write_fd = lifecycle._spawn(plan, record, 2.0)
    _SPAWNED.append(proc.pid)
    run_record.write_pid(record, plan, proc)
    os.write(write_fd, b"detach\n")  # as start does once the server is ready
    os.close(write_fd)
    return record, proc, record.run_dir


_SPAWNED: list[int] = []


@pytest.fixture
def art(tmp_path):
    """The artifacts folder; afterwards, whatever a failing test left is killed."""
    folder = tmp_path / "art"
    yield folder
    for pgid in _SPAWNED:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except OSError:
            pass
    _SPAWNED.clear()
    for pid in marked(""):  # left the group: found by this test's folder in its environment
        try:
            if str(tmp_path).encode() in Path(f"/proc/{pid}/environ").read_bytes():
                os.kill(pid, signal.SIGKILL)
        except OSError:
            continue


def stop(capsys, art) -> tuple[int, str]:
    code = main(["stop", "--artifacts", str(art), "--grace", "2"])
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    return code, out.out


def test_stop_ends_a_process_that_left_the_group(capsys, art):
    """setsid puts a grandchild in its own session: killpg misses it, the marker does not."""
    record, proc, run_dir = run(art, "setsid sleep 300 & sleep 300 & wait")
    assert wait_until(lambda: len(launched_in(run_dir)) >= 3, 20), launched_in(run_dir)
    escaped = [p for p in launched_in(run_dir) if os.getpgid(p) != proc.pid]
    assert escaped, "the setsid child left the group"
    code, out = stop(capsys, art)
    assert code == 0
    assert f"cpu-tiny: stopped process group {proc.pid}" in out
    assert wait_until(lambda: not launched_in(run_dir), 10), launched_in(run_dir)
    assert not any(alive(p) for p in escaped)
    assert not record.pid_file.exists()


@pytest.mark.parametrize("relative", [False, True], ids=["absolute", "relative-artifacts"])
def test_a_dead_leader_with_live_members_is_still_ended(capsys, art, monkeypatch, relative):
    record, proc, run_dir = run(art, "sleep 300 & sleep 300 & wait")
    assert wait_until(lambda: len(launched_in(run_dir)) >= 4, 20)
    os.kill(proc.pid, signal.SIGKILL)  # the keeper dies without tearing down
    proc.wait(timeout=10)
    members = launched_in(run_dir)
    assert members and all(os.getpgid(p) == proc.pid for p in members)
    if relative:  # the markers hold the absolute run folder
        monkeypatch.chdir(art.parent)
    code, out = stop(capsys, Path(art.name) if relative else art)
    assert code == 0
    assert "not running" not in out, out
    assert wait_until(lambda: not launched_in(run_dir), 10), launched_in(run_dir)


def test_a_corrupt_pid_file_does_not_keep_a_live_run_running(capsys, art):
    live, proc, live_dir = run(art, "sleep 300 & wait")
    corrupt, proc2, corrupt_dir = run(art, "sleep 300 & wait", profile="dsv41-sm120-tp2-dcp1")
    assert wait_until(lambda: launched_in(live_dir) and launched_in(corrupt_dir), 20)
    corrupt.pid_file.write_bytes(b"\x00{not json")
    code, out = stop(capsys, art)
    assert code == 0, out
    assert f"cpu-tiny: stopped process group {proc.pid}" in out
    assert (
        f"dsv41-sm120-tp2-dcp1: unreadable pid file {corrupt.pid_file} (JSONDecodeError: "
    ) in out
    assert wait_until(lambda: not launched_in(live_dir) and not launched_in(corrupt_dir), 10)
    assert not live.pid_file.exists() and not corrupt.pid_file.exists()


def test_a_run_whose_pid_file_is_gone_is_still_ended(capsys, art):
    """A start that died between spawning and writing its pid file (or a hand delete)."""
    record, _, run_dir = run(art, "sleep 300 & wait")
    assert wait_until(lambda: len(launched_in(run_dir)) >= 3, 20)
    record.pid_file.unlink()
    code, out = stop(capsys, art)
    assert code == 0
    assert f"cpu-tiny: ended 3 process(es) of {record.run_dir} (no pid file)" in out
    assert wait_until(lambda: not launched_in(run_dir), 10), launched_in(run_dir)


def test_status_shows_a_corrupt_pid_file_as_a_row(capsys, art):
    record, _, run_dir = run(art, "sleep 300 & wait")
    record.pid_file.write_text("[]")
    code = main(["status", "--artifacts", str(art), "--json"])
    rows = json.loads(capsys.readouterr().out)
    assert code == 1  # nothing healthy
    assert rows[0]["health"].startswith("unreadable pid file (")
    assert rows[0]["running"] is True  # its processes are found by their marker
    stop(capsys, art)
    assert wait_until(lambda: not launched_in(run_dir), 10)


def test_a_matching_pid_and_start_time_of_an_unrelated_process_is_left_alone(capsys, art):
    """The record's pid and start time match a process the launcher did not start."""
    record, proc, run_dir = run(art, "sleep 300 & wait")
    stranger = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        data = json.loads(record.pid_file.read_text())
        stop(capsys, art)  # the real run goes; its record is gone
        assert wait_until(lambda: not launched_in(run_dir), 10)
        data["pgid"] = stranger.pid
        data["start_ticks"] = processes.start_ticks(stranger.pid)
        record.pid_file.write_text(json.dumps(data))
        code, out = stop(capsys, art)
        assert code == 0
        assert "not running (stale pid file" in out
        assert stranger.poll() is None, "stop signalled a process it did not start"
    finally:
        stranger.kill()
        stranger.wait()


def test_a_run_recorded_before_the_command_line_was_kept_is_still_stopped(capsys, art):
    """A pid file without ``cmdline`` (written by the launcher before it kept one) and a
    server without the run marker: the leader is trusted on its start time, as then."""
    old_server = subprocess.Popen(["sleep", "300"], start_new_session=True)
    _SPAWNED.append(old_server.pid)
    try:
        run_dir = art / "cpu-tiny" / "20261130T000000Z"
        run_dir.mkdir(parents=True)
        pid = {"pgid": old_server.pid, "start_ticks": processes.start_ticks(old_server.pid)}
        (run_dir / run_record.PID_FILE).write_text(json.dumps({**pid, "profile": "cpu-tiny"}))
        code, out = stop(capsys, art)
        assert code == 0
        assert f"cpu-tiny: stopped process group {old_server.pid}" in out
        assert wait_until(lambda: old_server.poll() is not None, 10)
    finally:
        old_server.kill()
        old_server.wait()


def test_stop_leaves_another_artifacts_folders_run_alone(capsys, art, tmp_path):
    """Same profile, same second: the run ids match; the run folders do not."""
    _, mine, _ = run(art, "sleep 300 & wait")
    _, theirs, _ = run(tmp_path / "other", "sleep 300 & wait")

    def group(pgid):
        return [p for p in map(int, filter(str.isdigit, os.listdir("/proc"))) if in_group(p, pgid)]

    assert wait_until(lambda: len(group(mine.pid)) >= 3 and len(group(theirs.pid)) >= 3, 20)
    their_pids = group(theirs.pid)
    stop(capsys, art)
    assert wait_until(lambda: not group(mine.pid), 10)
    assert all(alive(p) for p in their_pids), "a run recorded elsewhere must survive"
    assert main(["stop", "--artifacts", str(tmp_path / "other"), "--grace", "2"]) == 0
    assert wait_until(lambda: not group(theirs.pid), 10)


def test_stop_leaves_a_run_whose_folder_extends_this_runs_folder_alone(capsys, art):
    """Their marker BAKERY_LAUNCH_DIR=<my run folder>-x/... holds mine as a substring: stop
    must match the whole variable, or it ends a run it did not start."""
    _, mine, my_dir = run(art, "sleep 300 & wait")
    _, theirs, their_dir = run(Path(f"{my_dir}-x"), "sleep 300 & wait")
    assert str(their_dir).startswith(str(my_dir))
    assert wait_until(lambda: min(map(len, map(launched_in, (my_dir, their_dir)))) >= 3, 20)
    their_pids = launched_in(their_dir)
    code, out = stop(capsys, art)
    assert code == 0 and f"cpu-tiny: stopped process group {mine.pid}" in out, out
    assert wait_until(lambda: not launched_in(my_dir), 10)
    assert all(alive(p) for p in their_pids), "a run stop did not start must survive"
    assert main(["stop", "--artifacts", f"{my_dir}-x", "--grace", "2"]) == 0
    assert wait_until(lambda: not launched_in(their_dir), 10)


def in_group(pid: int, pgid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z" and int(fields[2]) == pgid


# ---- bad launcher input: one message, exit 2, no traceback ------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--port", "99999"], "Invalid value for '--port': 99999 is not in the range 1<=x<=65535"),
        (["--port", "-1"], "Invalid value for '--port': -1 is not in the range 1<=x<=65535"),
        (["--master-port", "0"], "Invalid value for '--master-port': 0 is not in the range"),
        (["--grace", "nan"], "Invalid value for '--grace': 'nan' is not a finite number >= 0"),
        (["--startup-timeout", "-5"], "'-5' is not a finite number >= 0"),
    ],
)
def test_bad_flag_values_are_usage_errors(capsys, tmp_path, args, message):
    code = main(["start", "--profile", "cpu-tiny", "--dry-run", *args])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'base = "cpu"\nmodel = "\xff"\n', "not UTF-8 text (byte 22: invalid start byte)"),
        (b'base = "cpu"\nmodel = "m"\nport = 99999\n', "$.port: must be 1..65535, not 99999"),
        (b'base = "cpu"\nmodel = "m"\nport = -1\n', "$.port: must be 1..65535, not -1"),
        (
            b'base = "cpu"\nmodel = "m"\nstartup_timeout_s = 0\n',
            "$.startup_timeout_s: must be at least 1, not 0",
        ),
        (
            b'base = "cpu"\nmodel = "m"\n[nodes]\nmaster_port = 70000\n',
            "$.nodes.master_port: must be 1..65535, not 70000",
        ),
        (b"base = [", "not valid TOML"),
        (
            b'base = "cpu"\nmodel = "a\\u0000b"\n',
            "$.model: must be non-empty text without NUL, not 'a\\x00b'",
        ),
        (
            b'base = "cpu"\nmodel = "m"\n[vllm]\nargs = ["\\u0000"]\n',
            "$.vllm.args[0]: must be text without NUL, not '\\x00'",
        ),
        # Unknown fields and wrong types, at the top and nested: the schema layer's refusals.
        (b'base = "cpu"\nmodel = "m"\nprot = 1\n', "$.prot: unknown field (known: base, model,"),
        (b'base = "cpu"\nmodel = "m"\n[nodes]\nbackedn = "ray"\n', "$.nodes.backedn: unknown"),
        (b'base = "cpu"\nmodel = "m"\nport = "8000"\n', "$.port: expected int, got str"),
        (b'base = "cpu"\nmodel = "m"\n[parallel]\ntp = 2.0\n', "$.parallel.tp: expected int, got"),
        (b'base = "cpu"\nmodel = "m"\n[gates]\ntiming = 1\n', "$.gates.timing: expected bool"),
        (b'base = "cpu"\nmodel = "m"\n[env]\nX = 1\n', "$.env.X: expected str, got int"),
        (b'base = "cpu"\nmodel = "m"\ngpu = "sm90"\n', "$.gpu: must be one of 'sm120', 'any'"),
        (b'base = "cpu"\n', "$.model: missing"),
    ],
    ids=[
        "not-utf8",
        "port-high",
        "port-negative",
        "timeout",
        "master-port",
        "not-toml",
        "nul-model",
        "nul-arg",
        "unknown-top",
        "unknown-nested",
        "port-str",
        "tp-float",
        "timing-int",
        "env-int",
        "gpu-unknown",
        "model-gone",
    ],
)
def test_bad_profiles_are_one_error_line(capsys, tmp_path, content, message):
    bad = tmp_path / "bad.toml"
    bad.write_bytes(content)
    code = main(["start", "--profile", str(bad), "--dry-run"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith(f"error: {bad}: ") and message in err and "Traceback" not in err


def test_a_profile_that_is_a_folder_is_one_error_line(capsys, tmp_path):
    folder = tmp_path / "folder.toml"
    folder.mkdir()
    code = main(["start", "--profile", str(folder), "--dry-run"])
    err = capsys.readouterr().err
    assert code == 2 and f"error: {folder}: cannot read it (Is a directory)" in err


def test_a_pid_file_reads_back_typed_and_a_null_command_line_is_refused(tmp_path):
    """server.pid decodes as a PidRecord: an old record without a command line is checked
    by start time alone (cmdline None); one that says null is an error, never that."""
    path = tmp_path / "cpu-tiny" / "run" / run_record.PID_FILE
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"pgid": 5, "start_ticks": 7, "profile": "cpu-tiny"}))
    old = run_record.read_pid(path)
    assert (old.pgid, old.start_ticks, old.cmdline, old.error) == (5, 7, None, None)
    path.write_text(json.dumps({"pgid": 5, "start_ticks": 7, "cmdline": None}))
    forged = run_record.read_pid(path)
    assert forged.pgid == -1 and "$.cmdline" in (forged.error or "")
    path.write_text(json.dumps({"pgid": "5", "start_ticks": 7, "cmdline": ["x"]}))
    assert "$.pgid: expected int" in (run_record.read_pid(path).error or "")
