"""Issue 22, finding 15: TERM and HUP to `run.sh matrix` during capture tear the server
down as INT does (only INT reached the `finally` before; the server leaked)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from _launch_support import REPO, free_port, wait_until

# A stand-in vLLM: /health and a 1-token completion, enough for the launcher's probe.
_FAKE_SERVER = """
import http.server, json, os, sys
open(sys.argv[2], "w").write(str(os.getpid()))
class H(http.server.BaseHTTPRequestHandler):
    def _ok(self, body):
        data = json.dumps(body).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(data)))
        self.end_headers(); self.wfile.write(data)
    def do_GET(self): self._ok({})
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"])); self._ok({"choices": [{}]})
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""

# The matrix's serve-capture-stop step in a child; its capture blocks until signalled.
_CHILD = """
import dataclasses, sys, time
from pathlib import Path
from types import SimpleNamespace
from bakery.parity import matrix
from bakery.launch.gates import load_gate_table
from bakery.launch.plan import make_plan
from bakery.launch.preflight import Facts
from bakery.launch.profiles import load_profile, override
port, pidfile, art, marker, fake = sys.argv[1:6]
root = Path.cwd()
profile = load_profile("cpu-tiny", root / "launcher/dcp2/profiles",
                       load_gate_table(root / "patches/dcp2"))
profile = override(profile, port=int(port), startup_timeout_s=30)
plan = make_plan(profile, python=Path(sys.executable), tree=root / "build" / "baked-cpu",
                 root=root, artifacts=Path(art))
plan = dataclasses.replace(plan, command=(sys.executable, "-c", fake, port, pidfile))
def capture(*args, **kwargs):
    Path(marker).write_text("capturing")
    time.sleep(120)
matrix.capture_bundle = capture
entry = matrix.Entry(profile="cpu-tiny", given_name="cand")
matrix._serve_and_capture(entry, (plan, SimpleNamespace(facts=Facts())), Path(art) / "b",
                          None, None, SimpleNamespace(grace_s=2.0), lambda *_: None)
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    return state != "Z"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_signal_during_capture_stops_the_server(tmp_path, sig):
    pidfile, marker = tmp_path / "server.pid", tmp_path / "capturing"
    args = [str(free_port()), str(pidfile), str(tmp_path / "art"), str(marker), _FAKE_SERVER]
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, *args], cwd=REPO, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert wait_until(marker.exists, 60), child.stderr and child.communicate(timeout=5)
        server = int(pidfile.read_text())
        assert alive(server)
        child.send_signal(sig)
        _, err = child.communicate(timeout=60)
        assert wait_until(lambda: not alive(server), 15), f"server {server} leaked: {err}"
        assert "LaunchInterrupted" in err or child.returncode == -sig, err
    finally:
        if child.poll() is None:
            child.kill()
        if pidfile.exists() and alive(int(pidfile.read_text())):
            os.kill(int(pidfile.read_text()), signal.SIGKILL)
        time.sleep(0)
