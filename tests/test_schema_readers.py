"""Issue 22, findings 16 and 17: every file bakery reads back goes through one bounded,
non-blocking, depth-limited reader (bakery.schema.read_text / tree.read_bounded): a FIFO
never hangs a command, /dev/zero never fills memory, deep nesting and huge dotted keys are
one error, never a traceback. Each case runs the real CLI in a child with a time limit."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

SERIES = REPO / "patches" / "dcp2"
PROFILES = REPO / "launcher" / "dcp2" / "profiles"
ORACLE = REPO / "tests" / "data" / "oracle" / "b200_tp2_nomtp"


def cli(*args: str, door: str = "bakery", timeout: float = 60, env: dict | None = None):
    """The CLI in a child: a hang is a failure (TimeoutExpired), not a stuck suite."""
    code = (
        "import sys; from bakery.cli.launch import main; sys.exit(main(sys.argv[1:]))"
        if door == "run.sh"
        else "import sys; from bakery.cli.root import main; sys.exit(main(sys.argv[1:]))"
    )
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env={**os.environ, **(env or {})},
    )


def one_error(proc, code: int = 2) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    assert proc.stderr.startswith("error: ") and "Traceback" not in proc.stderr, proc.stderr
    return proc.stderr


def hostile(path: Path, kind: str) -> None:
    path.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "zero":
        path.symlink_to("/dev/zero")
    elif kind == "deep-toml":
        path.write_text("a = " + "[" * 5000 + "]" * 5000 + "\n")
    elif kind == "inline-toml":
        path.write_text("a = " + "{b = " * 100 + "1" + "}" * 100 + "\n")
    elif kind == "dotted":
        path.write_text("a" + ".a" * 50_000 + " = 1\n")
    elif kind == "deep-json":
        path.write_text("[" * 100_000 + "]" * 100_000)
    elif kind == "nested-json":
        path.write_text("[" * 100 + "]" * 100)


@pytest.fixture
def series(tmp_path: Path) -> Path:
    copy = tmp_path / "series"
    shutil.copytree(SERIES, copy)
    return copy


TOML_KINDS = ["fifo", "zero", "deep-toml", "inline-toml", "dotted"]


@pytest.mark.parametrize("kind", TOML_KINDS)
def test_a_hostile_series_toml(series, kind):
    hostile(series / "series.toml", kind)
    err = one_error(cli("bake", "--check", "--series", str(series)))
    assert "series.toml" in err


@pytest.mark.parametrize("kind", TOML_KINDS)
def test_a_hostile_stages_toml(series, kind):
    hostile(series / "stages.toml", kind)
    err = one_error(cli("stages", "--series", str(series)))
    assert "stages.toml" in err


@pytest.mark.parametrize("kind", TOML_KINDS)
def test_a_hostile_profile(tmp_path, kind):
    profile = tmp_path / "p.toml"
    hostile(profile, kind)
    proc = cli("start", "--profile", str(profile), "--dry-run", door="run.sh")
    assert "p.toml" in one_error(proc)


@pytest.mark.parametrize("kind", TOML_KINDS)
def test_a_hostile_matrix(tmp_path, kind):
    matrix = tmp_path / "m.toml"
    hostile(matrix, kind)
    proc = cli("matrix", "--matrix", str(matrix), "--out", str(tmp_path / "o"), door="run.sh")
    assert "m.toml" in one_error(proc)


JSON_KINDS = ["fifo", "zero", "deep-json", "nested-json"]


@pytest.mark.parametrize("kind", JSON_KINDS)
def test_a_hostile_gates_file(tmp_path, kind):
    gates = tmp_path / "gates.json"
    hostile(gates, kind)
    proc = cli("verify", "compare", str(ORACLE), str(ORACLE), "--gates", str(gates))
    assert "gates" in one_error(proc)


@pytest.mark.parametrize("kind", JSON_KINDS)
@pytest.mark.parametrize("which", ["case", "bundle.json"])
def test_a_hostile_bundle_file(tmp_path, kind, which):
    bundle = tmp_path / "bundle"
    shutil.copytree(ORACLE, bundle)
    name = "completion_short_math_logprobs20.json" if which == "case" else "bundle.json"
    hostile(bundle / name, kind)
    one_error(cli("verify", "compare", str(ORACLE), str(bundle)))


@pytest.mark.parametrize("kind", [*JSON_KINDS, "other_bases"])
def test_a_hostile_rebase_state(tmp_path, kind):
    state = tmp_path / "build" / ".rebase" / "state.json"
    state.parent.mkdir(parents=True)
    if kind == "other_bases":  # well-formed, but naming a base the series lacks
        state.write_text(json.dumps({
            "release": "vllm==0.2.0", "base_key": "default", "series": str(SERIES),
            "had_tree": True, "pin": {}, "dependencies": {}, "other_bases": {"nope": {}},
            "notes": [], "files": {},
        }))  # fmt: skip
        proc = cli("rebase", "--continue", "--build", str(tmp_path / "build"))
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        return
    hostile(state, kind)
    err = one_error(cli("status", "--build", str(tmp_path / "build")))
    assert "the rebase state" in err and "is damaged" in err


@pytest.mark.parametrize("kind", JSON_KINDS)
def test_a_hostile_pid_file_or_log(tmp_path, kind):
    run = tmp_path / "art" / "cpu-tiny" / "20260101T000000Z"
    run.mkdir(parents=True)
    hostile(run / "server.pid", kind)
    proc = cli("status", "--artifacts", str(tmp_path / "art"), door="run.sh")
    assert proc.returncode in (0, 1) and "Traceback" not in proc.stderr, proc.stderr
    if kind in ("fifo", "zero"):
        hostile(run / "serve.log", kind)
        proc = cli("logs", "--artifacts", str(tmp_path / "art"), door="run.sh")
        assert proc.returncode == 0 and "not a regular file" in proc.stdout, proc.stderr


def test_logs_takes_a_huge_line_count_and_shows_no_terminal_escapes(tmp_path):
    run = tmp_path / "art" / "cpu-tiny" / "20260101T000000Z"
    run.mkdir(parents=True)
    (run / "serve.log").write_bytes(b"one\n\x1b]0;owned\x07two \x1b[31mred\x1b[0m\n")
    proc = cli("logs", "-n", "99999999999999999999", "--artifacts", str(tmp_path / "art"),
               door="run.sh")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stdout and "\x07" not in proc.stdout
    assert proc.stdout.splitlines()[-2:] == ["one", "?]0;owned?two ?[31mred?[0m"]


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--timeout", "nan"], "the timeout 0 < s <= 86400"),
        (["--timeout", "inf"], "the timeout 0 < s <= 86400"),
        (["--url", "http://[::1"], "--url is not a URL"),
        (["--url", "http://127.0.0.1:99999"], "port must be 1..65535"),
    ],
)
def test_capture_refuses_a_bad_timeout_or_url(tmp_path, args, expected):
    base = ["--url", "http://127.0.0.1:9"] if "--url" not in args else []
    proc = cli("verify", "capture", *base, *args, "--out", str(tmp_path / "o"))
    assert expected in one_error(proc)


def test_a_suite_asking_for_a_trillion_prompt_tokens_is_refused(tmp_path):
    suite = tmp_path / "s.jsonl"
    suite.write_text(json.dumps({"case": "x", "max_tokens": 1, "prompt_tokens": 10**12,
                                 "filler": "a "}) + "\n")  # fmt: skip
    proc = cli("verify", "capture", "--url", "http://127.0.0.1:9", "--suite", str(suite),
               "--out", str(tmp_path / "o"))  # fmt: skip
    expected = "$.prompt_tokens: must be a positive integer (at most 1048576), not 1000000000000"
    assert expected in one_error(proc)


@pytest.mark.parametrize("damage", ["[" * 100_000, '{"vllm/a.py": "big"}', "[1, 2]"])
def test_a_corrupt_pristine_stamp_is_extracted_again(tmp_path, damage):
    """Too deep, mistyped (a stamp decodes as path -> (size, mtime_ns)) or no table."""
    from tests._synthetic_release import make_loop

    series, build, cli_, _, _ = make_loop(tmp_path)
    stamps = list((build / ".pristine").glob("*.stamp.json"))
    assert stamps
    for stamp in stamps:
        stamp.write_text(damage)
    proc = cli_("bake")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert all(json.loads(s.read_text()) for s in stamps)  # stamped again, whole
