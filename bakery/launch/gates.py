"""The DCP gate table as the launcher needs it, read from the series' stages.toml.

stages.toml is the single source of truth (``bakery.series.stages`` owns its
schema, its stage list and PLAN.md rendering); this module only interprets the
``[gates]`` and ``[env.*]`` tables the launcher checks against: the stage range, the lowest
stage that serves DCP > 1, every DSV41_* variable with its values, default and
lowest stage, and where the supported head set lives in the baked source.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bakery.errors import SeriesError
from bakery.series.stages import EnvGate, Stage, StagesDoc, read_stages_doc, stages_of

__all__ = [
    "EnvGate",
    "GateTable",
    "load_gate_table",
    "gate_table_of",
    "STAGE",
    "COMBINE",
    "GATHER",
    "TIMING",
    "CANDIDATES",
    "SPECULATIVE",
    "PCP",
]

# The four gates the launcher sets from its own flags (names fixed by the interface).
STAGE = "DSV41_DCP_STAGE"
COMBINE = "DSV41_DCP_COMBINE"
GATHER = "DSV41_DCP_PREFILL_GATHER"
TIMING = "DSV41_DCP_TIMING"

# What a checkpoint or a vLLM flag can ask for under DCP > 1, by the stage name
# that serves it in stages.toml (a renamed stage fails loudly at load).
CANDIDATES = "candidate-blocks"  # text_config.candidate_source_layer_id >= 0
SPECULATIVE = "speculative-decode"  # MTP / DSpark: --speculative-config, --spec-*
PCP = "pcp-dcp"  # --prefill-context-parallel-size > 1
FEATURES = (CANDIDATES, SPECULATIVE, PCP)
_HINT = "see patches/dcp2/stages.toml: the [gates] and [env.*] tables the launcher reads"


@dataclass(frozen=True)
class GateTable:
    source: Path
    stage_env: str
    stage_default: int
    stage_min: int
    stage_max: int
    dcp_min_stage: int
    heads_file: str  # relative to the baked package folder (vllm/)
    heads_name: str
    spec_methods: tuple[str, ...]
    env: dict[str, EnvGate]
    stages: tuple[Stage, ...]

    def behaves_as(self, stage: int) -> int:
        """The highest implemented stage at or below ``stage`` (planned ones have no code)."""
        implemented = [s.number for s in self.stages if s.status == "implemented"]
        return max((n for n in implemented if n <= stage), default=stage)

    def status(self, stage: int) -> str:
        return next((s.status for s in self.stages if s.number == stage), "unknown")

    def feature(self, name: str) -> Stage:
        """The stage that serves feature ``name`` (one of ``FEATURES``)."""
        return next(s for s in self.stages if s.name == name)

    def serves(self, name: str, stage: int) -> bool:
        """Does DSV41_DCP_STAGE=``stage`` serve feature ``name`` under DCP > 1?"""
        needed = self.feature(name)
        return needed.status == "implemented" and stage >= needed.number


def _env_gates(env: dict[str, EnvGate], where: Path) -> dict[str, EnvGate]:
    for name, gate in env.items():
        if not gate.values and gate.number is None:
            raise SeriesError(
                f'{where}: $.env.{name}: give values or number = "positive"', hint=_HINT
            )
        if not gate.accepts(gate.default):
            raise SeriesError(
                f"{where}: $.env.{name}.default: not {gate.expected}: {gate.default!r}", hint=_HINT
            )
    return env


def load_gate_table(series_root: Path) -> GateTable:
    where = Path(series_root) / "stages.toml"
    return gate_table_of(read_stages_doc(series_root), where)


def gate_table_of(doc: StagesDoc, where: Path) -> GateTable:
    """The decoded stages.toml as the launcher's table, once the launcher's rules hold."""
    stages = stages_of(doc, where)
    gates = doc.gates
    if gates is None:
        raise SeriesError(
            f"{where}: $.gates: missing (the launcher's stage range and head set)", hint=_HINT
        )
    # The stage numbers the launcher hands vLLM: each must name a stage of the table, in
    # order (a stage_max of 10**23 would let any DSV41_DCP_STAGE through).
    keys = ("stage_min", "stage_default", "dcp_min_stage", "stage_max")
    for key in keys:
        value = getattr(gates, key)
        if not 1 <= value <= len(stages):
            raise SeriesError(
                f"{where}: $.gates.{key}: must be a stage of the table, 1..{len(stages)}, "
                f"not {value!r}",
                hint=_HINT,
            )
    low, default, dcp, high = (getattr(gates, key) for key in keys)
    if not (low <= default <= high and low <= dcp <= high):
        raise SeriesError(
            f"{where}: $.gates: stage_min <= stage_default, dcp_min_stage <= stage_max must "
            f"hold, not {low}, {default}, {dcp}, {high}",
            hint=_HINT,
        )
    heads = gates.heads
    if heads is None:
        raise SeriesError(
            f"{where}: $.gates.heads_source: expected '<file>:<name>', got {gates.heads_source!r}",
            hint=_HINT,
        )
    table = GateTable(
        source=where,
        stage_env=gates.stage_env,
        stage_default=gates.stage_default,
        stage_min=gates.stage_min,
        stage_max=gates.stage_max,
        dcp_min_stage=gates.dcp_min_stage,
        heads_file=heads[0],
        heads_name=heads[1],
        spec_methods=gates.spec_methods,
        env=_env_gates(doc.env, where),
        stages=stages,
    )
    missing = [n for n in (STAGE, COMBINE, GATHER, TIMING) if n not in table.env]
    if table.stage_env != STAGE or missing:
        raise SeriesError(
            f"{where}: the launcher's gates are not in the table: {missing or [STAGE]!r}",
            hint=_HINT,
        )
    unnamed = [f for f in FEATURES if f not in {s.name for s in stages}]
    if unnamed:
        raise SeriesError(
            f"{where}: no stage serves the launcher's feature(s): {unnamed!r}", hint=_HINT
        )
    return table
