"""`bakery clean`: old wheels, reports and trash out of the build folder; `--cache` drops
what no pin wants; `--all` the whole build output. Synthetic wheels in a private cache
(tests/_synthetic_release.py), so the shared cache is never touched. What is left is read
from the file system (os.listdir, os.path), not through the code under test."""

import json
import os
import tomllib

from tests._synthetic_release import make_loop
from tests.conftest import run_cli

OLD_WHEEL = "vllm-0.1.0+t.00000000-cp38-abi3-manylinux_2_28_x86_64.whl"
FOREIGN = "vllm-0.1.0+other.0123abcd-cp38-abi3-manylinux_2_28_x86_64.whl"
LINKED = "vllm-0.1.0+t.11111111-cp38-abi3-manylinux_2_28_x86_64.whl"
SYMLINK_WHEEL = {f"dist/{LINKED}"}


def listing(root) -> set[str]:
    out = set()
    for dirpath, dirnames, names in os.walk(root):
        for name in names + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            out.add(os.path.relpath(os.path.join(dirpath, name), root))
    return out


def setup(tmp_path):
    series, build, cli, new, clean_pins = make_loop(tmp_path)
    assert cli("bake", "--base", "cpu").returncode == 0
    dist = build / "dist"
    current = sorted(os.listdir(dist))
    (dist / OLD_WHEEL).write_bytes(b"an older bake's wheel")
    (dist / FOREIGN).write_bytes(b"another series' wheel")
    outside = tmp_path / "outside.whl"
    outside.write_bytes(b"not ours")
    (dist / LINKED).symlink_to(outside)
    assert cli("rebase", "--to", "vllm==0.1.1").returncode == 0  # build/rebase/vllm-0.1.1
    (build / ".trash").mkdir(exist_ok=True)
    (build / ".trash" / "old-tree").write_text("x")
    return series, build, cli, current, outside


def test_clean_removes_old_wheels_reports_and_trash_only(tmp_path):
    series, build, cli, current, outside = setup(tmp_path)
    before = listing(build)
    dry = cli("clean", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert f"would remove: {build / 'dist' / OLD_WHEEL}" in dry.stdout
    assert f"would remove: {build / 'rebase'}" in dry.stdout
    assert f"would remove: {build / '.trash'}" in dry.stdout
    assert dry.stdout.count("would remove: ") == 3
    assert listing(build) == before  # a dry run removes nothing
    proc = cli("clean")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("removed: ") == 3 and "clean: 3 item(s)" in proc.stdout
    assert sorted(os.listdir(build / "dist")) == sorted(
        [*current, FOREIGN, "vllm-0.1.0+t.11111111-cp38-abi3-manylinux_2_28_x86_64.whl"]
    )
    assert outside.read_bytes() == b"not ours"  # a symlink is never followed or removed
    assert not (build / "rebase").exists() and not (build / ".trash").exists()
    assert cli("bake", "--check").returncode == 0
    assert cli("bake", "--check", "--base", "cpu").returncode == 0


def test_clean_cache_keeps_what_the_pins_bakes_and_a_rebase_want(tmp_path):
    series, build, cli, _, _ = setup(tmp_path)
    cache = tmp_path / "cache"
    pins = tomllib.loads((series / "series.toml").read_text())
    wanted = {pins["bases"][k]["sha256"] for k in ("default", "cpu")}
    assert set(os.listdir(cache / "wheels")) > wanted  # 0.2.0 and 0.1.1 are there too
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("mine")
    (cache / "wheels" / ("f" * 64)).symlink_to(elsewhere)
    index = (cache / "index.json").read_bytes()

    # During a rebase, its pins stay too, and --all is refused.
    assert cli("rebase", "--to", "vllm==0.2.0", "--checkout").returncode == 1
    state = json.loads((build / ".rebase" / "state.json").read_text())
    assert cli("clean", "--cache").returncode == 0
    assert state["pin"]["sha256"] in os.listdir(cache / "wheels")
    refused = cli("clean", "--all")
    assert refused.returncode == 2 and "a rebase onto vllm==0.2.0 is in progress" in refused.stderr
    assert cli("rebase", "--abort").returncode == 0

    proc = cli("clean", "--cache")
    assert proc.returncode == 0, proc.stderr
    assert set(os.listdir(cache / "wheels")) == wanted | {"f" * 64}
    assert {n[:64] for n in os.listdir(cache / "pristine")} <= wanted
    assert (elsewhere / "keep.txt").read_text() == "mine"
    assert (cache / "index.json").read_bytes() == index  # the trust record stays
    assert cli("bake", "--check").returncode == 0
    assert cli("bake").returncode == 0  # and a bake needs no download


def test_clean_all_leaves_a_build_folder_that_bakes_again(tmp_path):
    series, build, cli, _, _ = setup(tmp_path)
    proc = cli("clean", "--all")
    assert proc.returncode == 0, proc.stderr
    # another series' wheel and a symlink are not this series' output: they stay
    assert listing(build) == {".bake.lock", f"dist/{FOREIGN}", *SYMLINK_WHEEL}
    assert cli("bake").returncode == 0
    assert cli("bake", "--check").returncode == 0


def test_clean_removes_the_pristine_copies_no_baked_tree_links_to(tmp_path):
    """A build folder's own copy of the pristine tree goes with the last tree linking it."""
    import shutil

    series, build, cli, _, _ = make_loop(tmp_path)
    kept = listing(build / ".pristine")
    assert len(kept) > 2 and ".pristine" not in cli("clean", "--dry-run").stdout
    cache = listing(tmp_path / "cache")
    shutil.rmtree(build / "baked")
    proc = cli("clean")
    # the tree, its stamp and its RECORD errata
    assert proc.returncode == 0 and proc.stdout.count("pristine copy no baked tree") == 3
    assert listing(build / ".pristine") == set() and listing(tmp_path / "cache") == cache
    assert cli("bake").returncode == 0 and listing(build / ".pristine") == kept


def test_clean_refuses_a_folder_bakery_did_not_build(tmp_path):
    """`--build .` in a checkout: nothing there is bakery's, so clean refuses it whole
    (before: --all deleted the checkout and .git; clean alone its rebase/ and matrix/)."""
    series, build, cli, _, _ = make_loop(tmp_path)
    repo = tmp_path / "repo"
    for rel in (".git/HEAD", "README.md", "rebase/notes.md", "matrix/plan.md", "dist/x.whl"):
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text("mine")
    before = listing(repo)
    for flags in (["--all"], [], ["--all", "--cache"]):
        proc = run_cli(
            "clean",
            *flags,
            "--series",
            str(series),
            "--build",
            str(repo),
            env={"BAKERY_CACHE": str(tmp_path / "cache")},
        )
        assert proc.returncode == 2, (flags, proc.stdout, proc.stderr)
        assert proc.stderr.startswith("error: not a bakery build folder")
        assert proc.stderr.count("\n") == 2 and "hint: " in proc.stderr
        assert "removed" not in proc.stdout and listing(repo) == before


def test_clean_all_takes_only_what_bakery_wrote(tmp_path):
    """--all takes the trees, their records, the series' wheels and reports; the rerere
    records, the tiny models and files bakery never writes stay (before: all of it went)."""
    series, build, cli, _, _ = setup(tmp_path)
    keep = {
        ".rerere/" + "a" * 64: "a fix",
        "tiny-llama/config.json": "{}",
        "tiny-v41-fast/model.safetensors": "w",
        "baked-notes/todo.md": "not a tree: no BAKED.json",
        "notes.txt": "mine",
        "rebase/todo.md": "mine",
        "matrix/plan.md": "mine",
        ".pristine/README": "mine",
    }
    for rel, text in keep.items():
        (build / rel).parent.mkdir(parents=True, exist_ok=True)
        (build / rel).write_text(text)
    (build / "matrix" / "matrix.md").write_text("| a report |")
    proc = cli("clean", "--all")
    assert proc.returncode == 0, proc.stderr
    left = listing(build)
    assert set(keep) <= left and all((build / r).read_text() == t for r, t in keep.items())
    assert not any(r.startswith(("baked/", "baked-cpu", ".baked", "rebase/vllm")) for r in left)
    assert not (build / "matrix" / "matrix.md").exists()
    assert f"removed: {build / 'baked'} " in proc.stdout and ".rerere" not in proc.stdout
    assert left - set(keep) == {".bake.lock", f"dist/{FOREIGN}", *SYMLINK_WHEEL}


def test_clean_never_follows_a_symlinked_dist_or_pristine(tmp_path):
    """build/dist and build/.pristine as links to a shared wheelhouse: clean leaves the
    links and everything behind them, and says so (before: it emptied the targets)."""
    series, build, cli, _, _ = setup(tmp_path)
    shared = tmp_path / "wheelhouse"
    shared.mkdir()
    (shared / OLD_WHEEL).write_bytes(b"a shared wheel")
    (shared / ("b" * 64)).mkdir()
    (shared / ("b" * 64) / "f.py").write_text("theirs")
    for name in ("dist", ".pristine"):
        (build / name).rename(tmp_path / f"moved{name}")
        (build / name).symlink_to(shared)
    before = listing(shared)
    for flags in ([], ["--all"]):
        proc = cli("clean", *flags)
        assert proc.returncode == 0, proc.stderr
        assert f"left alone: {build / 'dist'} (a symlink" in proc.stdout
        assert f"left alone: {build / '.pristine'} (a symlink" in proc.stdout
        assert listing(shared) == before and (build / "dist").is_symlink()


def test_clean_while_a_bake_holds_the_lock_removes_nothing_and_says_so(tmp_path):
    """A bake holding build/.bake.lock: clean refuses before removing anything and prints
    no "removed:" line (before: a line per item, then exit 1 with everything still there)."""
    import fcntl

    series, build, cli, _, _ = setup(tmp_path)
    before = listing(build)
    with open(build / ".bake.lock", "r+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another open file: as a bake
        handle.write("4242\n")
        handle.flush()
        proc = cli("clean")
        status = cli("status")
    assert proc.returncode == 1 and "removed" not in proc.stdout
    assert proc.stderr.startswith("error: another bake is running in this build folder (pid 4242)")
    assert proc.stderr.count("\n") == 2 and listing(build) == before
    assert status.returncode == 0, status.stderr


def test_clean_during_a_rebase_checkout_keeps_what_both_trees_and_abort_need(tmp_path):
    """During `rebase --checkout`, clean keeps the pristine copies the checkout and the
    set-aside tree link to and the wheel `--abort` brings back (before: it removed all
    three), and `--abort` then gives the old bake back, up to date."""
    from tests._synthetic_release import make_loop

    series, build, cli, _, _ = make_loop(tmp_path)
    (wheel,) = sorted((build / "dist").glob("*.whl"))
    assert cli("rebase", "--to", "vllm==0.2.0", "--checkout").returncode in (0, 1)
    copies = sorted(p.name for p in (build / ".pristine").iterdir())
    proc = cli("clean")
    assert proc.returncode == 0, proc.stderr
    assert "/dist/" not in proc.stdout and "/.pristine/" not in proc.stdout, proc.stdout
    assert wheel.is_file()
    assert sorted(p.name for p in (build / ".pristine").iterdir()) == copies
    assert cli("rebase", "--abort").returncode == 0
    assert cli("bake", "--check").returncode == 0
    assert "  wheel: " + str(wheel) in cli("status").stdout
