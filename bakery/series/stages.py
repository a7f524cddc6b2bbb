"""The series' DCP stage table: ``patches/<series>/stages.toml``.

stages.toml is the single source of truth (the launcher reads it); PLAN.md's
table is rendered from it between two markers. ``bakery stages``
prints the table, ``--write`` rewrites it in PLAN.md.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Literal

from msgspec import Meta

from bakery import markdown, project
from bakery.errors import SeriesError
from bakery.schema import Document, load_toml
from bakery.series.series import load_series
from bakery.tree import write_atomic

__all__ = [
    "Stage",
    "StagesDoc",
    "GatesDoc",
    "EnvGate",
    "read_stages_doc",
    "load_stages",
    "stages_of",
    "render_table",
    "plan_table",
    "stage_table_problems",
    "write_plan",
    "BEGIN",
    "END",
]

BEGIN = "<!-- stages:begin (generated from stages.toml by bakery stages --write) -->"
END = "<!-- stages:end -->"
_HINT = f"see {project.SERIES}/stages.toml for the fields, their types and the rules"


# stages.toml's schema, the one place that knows its shape. [[stages]] is this module's;
# [gates] and [env.*] are read by bakery.launch.gates (the launcher's view of the table).
class Stage(Document, frozen=True):
    number: int
    name: str
    status: Literal["implemented", "planned"]
    enables: str
    env: tuple[str, ...]
    requires: tuple[str, ...]
    patches: tuple[str, ...]
    # What the whole-model CPU run (launcher/dcp2/matrix-cpu-v41.toml) covers of the stage,
    # and what only a GPU can.
    on_cpu: str = ""


class GatesDoc(Document, frozen=True):
    stage_env: str
    stage_default: int
    stage_min: int
    stage_max: int
    dcp_min_stage: int
    heads_source: str  # "<file in the package>:<name of the head set>"
    spec_methods: tuple[str, ...] = ()  # the draft methods stage 5 serves under DCP > 1

    @property
    def heads(self) -> tuple[str, str] | None:
        """heads_source as (file in the package, name assigned in it); None if malformed."""
        heads_file, sep, heads_name = self.heads_source.partition(":")
        if not (sep and heads_file and heads_name) or ":" in heads_name:
            return None
        return heads_file, heads_name


# A value a DSV41_* variable may take: it goes into vLLM's environment and, listed,
# into one-line messages ("must be one of ag_rs, a2a").
EnvValue = Annotated[
    str, Meta(pattern=r"^[^\x00-\x1f\x7f]*\Z", description="text without control characters")
]


class EnvGate(Document, frozen=True):
    """One ``[env.NAME]`` table: a DSV41_* variable the launcher checks."""

    default: EnvValue
    min_stage: int
    values: tuple[EnvValue, ...] = ()  # the accepted strings; or:
    number: Literal["positive"] | None = None  # a finite number > 0 (float() reads it)
    read_by: tuple[str, ...] = ()  # the patches that read it (tests check it against the diffs)

    def accepts(self, value: str) -> bool:
        if self.number is None:
            return value in self.values
        try:
            number = float(value)
        except ValueError:
            return False
        return math.isfinite(number) and number > 0

    @property
    def expected(self) -> str:
        return "a finite number > 0" if self.number else "one of " + ", ".join(self.values)


class StagesDoc(Document, frozen=True):
    stages: tuple[Stage, ...] = ()
    gates: GatesDoc | None = None
    env: dict[str, EnvGate] = {}


def read_stages_doc(root: Path) -> StagesDoc:
    """``root/stages.toml`` decoded, types and field names checked (not yet the rules)."""
    where = Path(root) / "stages.toml"
    if not where.exists():
        raise SeriesError(f"no stage table here (missing file): {str(where)!r}")
    return load_toml(where, StagesDoc, error=SeriesError, hint=_HINT)


def load_stages(root: Path) -> tuple[Stage, ...]:
    """The stages 1..N of ``root/stages.toml``, in order, each checked for shape."""
    return stages_of(read_stages_doc(root), Path(root) / "stages.toml")


def stages_of(doc: StagesDoc, where: Path) -> tuple[Stage, ...]:
    """The decoded [[stages]], once the rules types cannot say hold."""
    for stage in doc.stages:
        if stage.status == "implemented" and not stage.patches:
            raise SeriesError(
                f"{where}: implemented stage {stage.number} names no patch", hint=_HINT
            )
    numbers = [s.number for s in doc.stages]
    if numbers != list(range(1, len(numbers) + 1)):
        raise SeriesError(
            f"{where}: stages must be numbered 1..N in order: {numbers!r}", hint=_HINT
        )
    return doc.stages


def _cell(items: tuple[str, ...] | str) -> str:
    text = items if isinstance(items, str) else "<br>".join(items)
    return text or "—"


def render_table(stages: tuple[Stage, ...]) -> str:
    """The markdown stage table (no trailing newline)."""
    header = ("Stage", "Name", "Status", "Enables", "Env gates", "Constraints", "Patches", "On CPU")
    rows = [
        (
            s.number,
            s.name,
            s.status,
            _cell(s.enables),
            _cell(s.env),
            _cell(s.requires),
            _cell(tuple(f"`{p}`" for p in s.patches)),
            _cell(s.on_cpu),
        )
        for s in stages
    ]
    return markdown.table(header, rows)


def plan_table(plan_text: str) -> str:
    """The text between the markers of PLAN.md, stripped."""
    start, end = plan_text.find(BEGIN), plan_text.find(END)
    if start < 0 or end < start:
        raise SeriesError("PLAN.md lacks the stage-table markers")
    return plan_text[start + len(BEGIN) : end].strip()


def stage_table_problems(root: Path) -> list[str]:
    """Problems between stages.toml, PLAN.md and series.toml (empty when consistent).

    PLAN.md's table must equal the rendered one; every patch a stage names must
    be in series.toml; every series patch must be named by a stage, and its
    series.toml stage must be the lowest stage naming it.
    """
    root = Path(root)
    stages = load_stages(root)
    series = load_series(root)
    problems = []
    if plan_table((root / "PLAN.md").read_text()) != render_table(stages):
        problems.append(
            f"{root / 'PLAN.md'}: stage table differs from stages.toml (bakery stages --write)"
        )
    in_series = {e.file: e.stage for e in series.entries}
    lowest: dict[str, int] = {}
    for s in stages:
        for name in s.patches:
            if name not in in_series:
                problems.append(
                    f"stages.toml: stage {s.number} names a patch not in series.toml: {name!r}"
                )
            lowest.setdefault(name, s.number)
    for name, stage in in_series.items():
        if name not in lowest:
            problems.append(f"series.toml: patch named by no stage: {name!r}")
        elif lowest[name] != stage:
            problems.append(
                f"series.toml: patch {name!r} has stage {stage}, but the "
                f"lowest stage naming it is {lowest[name]}"
            )
    return problems


def write_plan(root: Path) -> None:
    """Render stages.toml's table into PLAN.md between the markers."""
    plan = root / "PLAN.md"
    text = plan.read_text()
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise SeriesError(f"{plan}: lacks the stage-table markers")
    table = render_table(load_stages(root))
    write_atomic(plan, (text[: start + len(BEGIN)] + "\n" + table + "\n" + text[end:]).encode())
