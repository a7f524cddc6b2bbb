"""The import check's verdict lines, read without a bake (a stand-in vllm package)."""

from pathlib import Path

from bakery.check.importcheck import import_check


def test_a_line_the_imported_code_prints_is_no_verdict(tmp_path):
    """Each verdict is one typed JSON line; a module that prints JSON-like lines of its own
    (or half of one) neither crashes the check nor passes for a verdict."""
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "__init__.py").write_text("")
    noisy = 'print("{not json")\nprint(\'{"module": "vllm.noisy", "ok": "yes"}\')\n'
    (tmp_path / "vllm" / "noisy.py").write_text(noisy)
    (tmp_path / "vllm" / "broken.py").write_text("raise ImportError('planted')\n")
    noisy_result, broken = import_check(tmp_path, ["vllm.noisy", "vllm.broken"])
    assert noisy_result.ok and Path(noisy_result.detail).parent == tmp_path.resolve() / "vllm"
    assert (broken.ok, broken.detail) == (False, "ImportError: planted")
