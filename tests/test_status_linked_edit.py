"""Fast: ``status`` reports an edit written through a hard link into the pristine cache.

An untouched file of a baked tree is a hard link to the cached pristine copy, so an
append (``>>``) changes both: the tree and the pristine tree still agree, and only the
pristine tree's stamp (size + mtime at extraction) shows it. Synthetic release, private
cache."""

from __future__ import annotations

import json
import os

from tests._synthetic_release import make_loop

LINKED = "vllm/__init__.py"  # not patched: the bake links it from the pristine cache


def test_status_reports_an_append_through_a_hard_link_into_the_pristine_cache(tmp_path):
    _, build, cli, _, _ = make_loop(tmp_path)
    tree = build / "baked"
    assert os.stat(tree / LINKED).st_nlink > 1, "the file must be the pristine cache's link"
    clean = json.loads(cli("status", "--json").stdout)["bases"]["default"]
    assert clean["stale"] == []
    with open(tree / LINKED, "ab") as handle:  # `echo ... >> file`
        handle.write(b"# appended\n")
    proc = cli("status", "--json")
    stale = json.loads(proc.stdout)["bases"]["default"]["stale"]
    assert f"modified through a hard link into the pristine cache: {LINKED}" in stale
    human = cli("status").stdout
    assert f"stale: modified through a hard link into the pristine cache: {LINKED}" in human
