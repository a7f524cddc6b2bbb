"""The release watch: `bakery rebase-matrix --latest` asks the package index (through pip,
bakery.bake.fetch.release_versions) for the newest releases of vllm and each pinned
dependency. Against a fake index served on 127.0.0.1, and against a closed local port
(offline: one error line and a hint, exit 2). pip reads only the environment set here:
no pip.conf, no find-links, no extra index."""

from __future__ import annotations

import contextlib
import http.server
import os
import socket
import threading
from pathlib import Path

import pytest

from bakery.bake.fetch import release_versions
from bakery.errors import FetchError, IndexUnreachable
from bakery.maintain.matrix import newest
from tests.conftest import run_cli

PLATFORM = "manylinux_2_28_x86_64"
FILES = {
    "vllm": [
        f"vllm-0.9.0-cp38-abi3-{PLATFORM}.whl",  # 0.9 < 0.34: versions, not strings
        f"vllm-0.32.0-cp38-abi3-{PLATFORM}.whl",
        f"vllm-0.34.0-cp38-abi3-{PLATFORM}.whl",
        f"vllm-0.35.0rc1-cp38-abi3-{PLATFORM}.whl",  # a pre-release is not a release
        "vllm-0.36.0.tar.gz",  # no wheel
        "vllm-0.37.0-cp38-abi3-macosx_11_0_arm64.whl",  # not for the pin's platform
    ],
    "flashinfer-python": [
        "flashinfer_python-0.7.0.post1-py3-none-any.whl",
        "flashinfer_python-0.7.4-py3-none-any.whl",
        "flashinfer_python-0.7.2.post1-py3-none-any.whl",
    ],
}


class _Index(http.server.BaseHTTPRequestHandler):
    """PEP 503 pages: /simple/<name>/ lists FILES[name]; anything else is a 404."""

    def do_GET(self) -> None:
        name = self.path.strip("/").removeprefix("simple/")
        if name not in FILES:
            self.send_error(404)
            return
        links = "".join(f'<a href="/files/{f}">{f}</a>\n' for f in FILES[name])
        body = f"<!DOCTYPE html><html><body>\n{links}</body></html>\n".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def _only_this_index(monkeypatch, url: str) -> None:
    for key in [k for k in os.environ if k.startswith("PIP_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", url)


@pytest.fixture
def fake_index(monkeypatch):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Index)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _only_this_index(monkeypatch, f"http://127.0.0.1:{server.server_address[1]}/simple/")
    yield
    server.shutdown()
    server.server_close()


@pytest.fixture
def offline(monkeypatch):
    with contextlib.closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    _only_this_index(monkeypatch, f"http://127.0.0.1:{port}/simple/")  # closed: refused


def test_releases_newest_first_final_wheels_for_the_platform(fake_index):
    assert [str(v) for v in release_versions("vllm", PLATFORM)] == ["0.34.0", "0.32.0", "0.9.0"]
    assert str(release_versions("flashinfer-python")[0]) == "0.7.4"


def test_a_project_the_index_lacks_is_a_fetch_error(fake_index):
    with pytest.raises(FetchError, match="lists no release of 'nosuch'") as caught:
        release_versions("nosuch")
    assert not isinstance(caught.value, IndexUnreachable)


def test_newest_pairs_each_pin_with_the_newest_release(fake_index, series):
    rows = {row.name: (row.pinned, row.newest) for row in newest(series)}
    assert rows == {"vllm": ("0.32.0", "0.34.0"), "flashinfer-python": ("0.7.0.post1", "0.7.4")}


def test_latest_runs_the_matrix_over_the_pin_and_the_newest(fake_index, tmp_path):
    # An empty cache and an index without the files: both rows are fetched and missing.
    env = {"BAKERY_CACHE": str(tmp_path / "cache")}
    proc = run_cli(
        "rebase-matrix", "--latest", "--no-linkcheck", "--out", str(tmp_path / "m"), env=env
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(
        "vllm: pinned 0.32.0, newest 0.34.0\nflashinfer-python: pinned 0.7.0.post1, newest 0.7.4\n"
    )
    assert "| patch | 0.32.0 | 0.34.0 |" in proc.stdout
    assert (tmp_path / "m" / "matrix.json").is_file()


def test_offline_is_one_error_and_a_hint_exit_2(offline, tmp_path):
    proc = run_cli("rebase-matrix", "--latest", "--out", str(tmp_path / "m"))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.splitlines()
    assert lines[0] == (
        "error: the package index could not be reached (Connection refused): asking for 'vllm'"
    )
    assert lines[1].startswith("hint: check the network") and len(lines) == 2
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not Path(tmp_path / "m").exists()  # nothing written


@pytest.mark.parametrize("args", [(), ("--latest", "--releases", "0.32.0")])
def test_one_of_releases_and_latest(args):
    proc = run_cli("rebase-matrix", *args)
    assert proc.returncode == 2 and proc.stderr.startswith("error: give one of --releases and")
