"""A real write fault for atomic-write tests: the file size limit (RLIMIT_FSIZE).

The writer runs in a child whose limit is below the new content's size, so the
kernel refuses the write part-way (EFBIG) whatever the writer's code looks like.
An atomic writer leaves the old content and no temp file behind; a writer that
writes in place, or forgets its temp file, is caught by the same check.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

OLD = b"old content\n"
LIMIT = 16 * 1024  # bytes the child may write to any one file

# name -> statement that writes ``data`` (bytes, 64 KiB) or ``manifest`` (its dict) to ``path``
WRITERS = {
    "tree.write_atomic": "from bakery.tree import write_atomic; write_atomic(path, data)",
    "manifest.write": "from bakery.bake import manifest as m; m.write(path, manifest)",
    # planted: writes in place, so a failure leaves half a file where the old one was
    "planted in-place": "path.write_bytes(data)",
    # planted: manifest.write before it used write_atomic (no cleanup on failure)
    "planted no-cleanup": (
        "import tempfile\n"
        "fd, tmp = tempfile.mkstemp(prefix=f'.{path.name}.', dir=path.parent)\n"
        "with os.fdopen(fd, 'wb') as handle:\n"
        "    handle.write(data)\n"
        "os.replace(tmp, path)"
    ),
}

_CHILD = """
import os, resource, signal, sys
sys.dont_write_bytecode = True  # a .pyc cut at the limit would break later imports
from pathlib import Path
path = Path(sys.argv[1])
manifest = {{"pad": "x" * 65536}}
data = b"n" * 65536
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG as an OSError, not a kill
resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, resource.RLIM_INFINITY))
try:
{body}
except OSError as exc:
    sys.exit(0 if exc.errno == 27 else 3)  # 27: EFBIG
sys.exit(4)  # the limit did not bite: the test would prove nothing
"""


def write_under_fault(writer: str, folder: Path) -> tuple[bytes, list[str]]:
    """Run ``WRITERS[writer]`` over an existing file under the size limit; return the file's
    bytes afterwards and every other name left in its folder."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "BAKED.json"
    path.write_bytes(OLD)
    body = "\n".join("    " + line for line in WRITERS[writer].splitlines())
    child = subprocess.run(
        [sys.executable, "-c", _CHILD.format(limit=LIMIT, body=body), str(path)],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert child.returncode == 0, (writer, child.returncode, child.stderr)
    return path.read_bytes(), sorted(p.name for p in folder.iterdir() if p != path)


def assert_atomic_under_fault(writer: str, folder: Path) -> None:
    content, others = write_under_fault(writer, folder)
    assert content == OLD, f"{writer}: the old file was damaged ({len(content)} bytes)"
    assert others == [], f"{writer}: left behind {others}"
