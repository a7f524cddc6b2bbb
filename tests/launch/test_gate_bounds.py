"""A gate bound that is not a finite number is refused wherever it comes from.

A NaN bound passes every comparison (``x > nan`` is False), and an infinite one can never
be broken: either turns a parity gate off without saying so. Parity gates come from a
gates file or a flag of ``bakery verify compare``; the launcher's numeric environment
gates (``number = "positive"`` in stages.toml) from the environment."""

from __future__ import annotations

import json
import math

import pytest
from _verify_support import MTP, NOMTP, run_cli

from bakery.launch.gates import load_gate_table
from tests.conftest import REPO

NOT_FINITE = ["nan", "inf", "-inf"]


@pytest.mark.parametrize("value", ["nan", "inf"])  # -inf: click's range (>= 0) refuses it
def test_a_non_finite_gate_flag_is_refused(value):
    code, out = run_cli(["compare", str(NOMTP), str(MTP), "--max-tf-kl", value])
    assert code == 2, out
    assert "gate 'max_tf_kl' must be a finite number" in out and "Traceback" not in out


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf], ids=NOT_FINITE)
def test_a_non_finite_bound_in_a_gates_file_is_refused(tmp_path, value):
    gates = tmp_path / "gates.json"
    gates.write_text(json.dumps({"gates": {"max_tf_kl": value}, "sources": {}}))  # NaN, Infinity
    code, out = run_cli(["compare", str(NOMTP), str(MTP), "--gates", str(gates)])
    assert code == 2, out
    assert "max_tf_kl" in out and "Traceback" not in out


def test_a_finite_gate_flag_is_taken():
    code, out = run_cli(["compare", str(NOMTP), str(MTP), "--max-tf-kl", "50"])
    assert code in (0, 1) and "must be a finite number" not in out, out


def test_a_numeric_environment_gate_takes_only_a_finite_positive_number():
    table = load_gate_table(REPO / "patches" / "dcp2")
    numeric = [gate for gate in table.env.values() if gate.number]
    assert numeric, "stages.toml has a numeric gate"
    for gate in numeric:
        assert gate.accepts("1.5") and gate.accepts("2")
        assert not any(gate.accepts(v) for v in [*NOT_FINITE, "0", "-1", "x"]), gate.name
