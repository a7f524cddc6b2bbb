"""tools/tiny_model.py: a click door onto lab.tiny_model (no model is built here)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from bakery.cli.boundary import run_command
from lab import tiny_model, tiny_v41
from tests.conftest import REPO, run_tool


@pytest.fixture
def door(monkeypatch, tmp_path):
    """The door's command, with ``build`` recording its folder instead of training a model."""
    monkeypatch.setattr(sys, "path", list(sys.path))  # the door prepends the repo: undone after
    spec = importlib.util.spec_from_file_location("tiny_door", REPO / "tools" / "tiny_model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    built: list[Path] = []

    def fake_build(out):
        built.append(Path(out))
        return Path(out)

    def fake_v41(out, spec, **_):
        built.append((Path(out), spec.name))
        return Path(out)

    monkeypatch.setattr(tiny_model, "build", fake_build)
    monkeypatch.setattr(tiny_v41, "build", fake_v41)
    monkeypatch.chdir(tmp_path)
    return module.tiny, built


def test_the_door_builds_only_what_is_missing_unless_forced(door, tmp_path, capsys):
    command, built = door
    ready = tmp_path / "ready"
    ready.mkdir()
    (ready / tiny_model.MARKER).write_text("{}")
    assert run_command(command, [str(ready)], "tiny") == 0
    assert built == [] and capsys.readouterr().out == f"tiny model: {ready}\n"
    assert run_command(command, [str(ready), "--force"], "tiny") == 0
    assert built == [ready]
    assert run_command(command, [], "tiny") == 0  # the default, under the project root (none: .)
    assert built == [ready, tiny_model.DEFAULT_DIR]


def test_the_v41_door_builds_the_named_spec_only_when_missing(door, tmp_path, capsys):
    command, built = door
    assert run_command(command, ["--v41", "released"], "tiny") == 0
    assert built == [(tiny_v41.DEFAULT_DIRS["released"], "released")]
    ready = tmp_path / "ready"
    ready.mkdir()
    spec = tiny_v41.SPECS["fast"]
    note = {"spec": tiny_v41.spec_note(spec), "recipe": tiny_v41.recipe()}
    (ready / tiny_v41.MARKER).write_text(json.dumps(note))
    assert run_command(command, [str(ready), "--v41", "fast"], "tiny") == 0
    assert len(built) == 1 and capsys.readouterr().out.endswith(f"tiny model: {ready}\n")
    # a Llama marker (another spec) or --force rebuilds; the Llama door is unchanged
    assert run_command(command, [str(ready), "--v41", "released"], "tiny") == 0
    assert run_command(command, [str(ready), "--v41", "fast", "--force"], "tiny") == 0
    assert built[1:] == [(ready, "released"), (ready, "fast")]
    assert run_command(command, [str(ready)], "tiny") == 0  # no Llama marker: builds one
    assert built[3:] == [ready]


def test_the_door_refuses_bad_usage_with_exit_2(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("")
    for args in (["--bogus"], ["a", "b"], [str(afile)], ["--v41", "huge"], ["--v41"]):
        proc = run_tool("tiny_model.py", *args)
        assert proc.returncode == 2, (args, proc.stderr)
        assert "Traceback" not in proc.stderr
    assert run_tool("tiny_model.py", "--help").stdout.startswith("Usage: tools/tiny_model.py")
    assert not (REPO / "a").exists()


def test_the_perturbed_door_moves_one_weight_of_a_copy(door, tmp_path, capsys, monkeypatch):
    """--perturbed copies the tiny Llama with PLANTED applied; safetensors reads it back."""
    import torch
    from safetensors.torch import load_file, save_file

    command, _ = door
    base = tmp_path / "build" / "tiny-llama"
    base.mkdir(parents=True)
    name, index, delta = tiny_model.PLANTED
    save_file({name: torch.zeros(4, 4), "other": torch.ones(2)}, base / "model.safetensors")
    (base / tiny_model.MARKER).write_text("{}")
    monkeypatch.setattr(tiny_model, "DEFAULT_DIR", Path("build/tiny-llama"))
    out = tmp_path / "moved"
    assert run_command(command, ["--perturbed", str(out)], "tiny") == 0
    moved, kept = load_file(out / "model.safetensors"), load_file(base / "model.safetensors")
    assert moved[name][index].item() == delta and kept[name].abs().sum().item() == 0
    assert (moved[name] != 0).sum().item() == 1 and torch.equal(moved["other"], kept["other"])
    assert json.loads((out / tiny_model.MARKER).read_text())["perturbed"]["delta"] == delta
    assert run_command(command, ["--perturbed", "--v41", "fast"], "tiny") == 2
