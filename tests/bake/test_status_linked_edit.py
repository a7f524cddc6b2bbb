"""Fast: an append (``>>``) to an untouched file of a baked tree stays in that tree.

The tree links to its build folder's own copy of the pristine tree, never to the shared
cache: ``status`` shows the file as modified since the bake and as an edit refresh would
pick up, the cache's stamp still holds, and the next bake puts the file back. Synthetic
release, private cache."""

from __future__ import annotations

import json
import os

from bakery.bake.pristine import pristine_edits
from tests._synthetic_release import make_loop

UNTOUCHED = "vllm/__init__.py"  # not patched: linked from the build folder's own copy


def test_status_reports_an_append_as_this_trees_edit_and_the_cache_keeps_none(tmp_path):
    _, build, cli, _, _ = make_loop(tmp_path)
    tree = build / "baked"
    cache = tmp_path / "cache"
    (cached,) = (cache / "pristine").glob(f"*/{UNTOUCHED}")
    assert os.stat(tree / UNTOUCHED).st_ino != os.stat(cached).st_ino
    clean = json.loads(cli("status", "--json").stdout)["bases"]["default"]
    assert clean["stale"] == [] and clean["pending"] == []
    with open(tree / UNTOUCHED, "ab") as handle:  # `echo ... >> file`
        handle.write(b"# appended\n")
    state = json.loads(cli("status", "--json").stdout)["bases"]["default"]
    assert f"modified since the bake: {UNTOUCHED}" in state["stale"]
    assert [p["action"] for p in state["pending"]] == ["add"], state["pending"]
    assert cached.read_bytes() == b"" and pristine_edits(cached.parents[1].name, cache) == []
    proc = cli("bake")
    assert proc.returncode == 0 and "copied again from the cache" in proc.stderr
    assert (tree / UNTOUCHED).read_bytes() == b""
    assert json.loads(cli("status", "--json").stdout)["bases"]["default"]["stale"] == []
