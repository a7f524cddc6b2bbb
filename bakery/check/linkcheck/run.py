"""The entry points: apply a series in memory, then check every touched file against
the overlay of patched files over the pristine tree, the allowlist applied, and the
names the series' stages.toml points at."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from bakery.check.linkcheck.checker import FileChecker
from bakery.check.linkcheck.classes import ClassIndex
from bakery.check.linkcheck.configs import ConfigTypes
from bakery.check.linkcheck.findings import Finding
from bakery.check.linkcheck.sources import SourceTree
from bakery.check.linkcheck.stagenames import stage_findings
from bakery.errors import BakeryError, SeriesError
from bakery.series.apply import plan
from bakery.series.series import Series

PACKAGE = "vllm"
_ALLOW_KEY = re.compile(r"^[^:\s]+\.py:[A-Za-z_][\w.]*$")


def _validate_allow(allow: Mapping[str, str]) -> None:
    for key, reason in allow.items():
        if not _ALLOW_KEY.match(key):
            raise SeriesError(
                f"[linkcheck.allow] key is not '<path>.py:<subject>': {key!r}",
                hint='e.g. "models/x/attention.py:DeepseekV4Attention.foo" = "set by a hook"',
            )
        if not str(reason).strip():
            raise SeriesError(f"[linkcheck.allow] entry needs a reason: {key!r}")


def check_touched_files(
    sources: SourceTree,
    touched: Mapping[str, bytes | None],
    allow: Mapping[str, str],
    *,
    package: str = PACKAGE,
    report_stale: bool = True,
    stages: Path | None = None,
) -> list[Finding]:
    """Findings for every touched ``.py`` file (paths relative to the ``package`` dir;
    their patched bytes must also be in ``sources.overlay``), allowlist applied; and for
    the names the stages.toml in the ``stages`` folder points at, when given."""
    _validate_allow(allow)
    index = ClassIndex(sources)
    configs = ConfigTypes(index)
    findings: list[Finding] = []
    for path in sorted(touched):
        if path.endswith(".py") and touched[path] is not None:
            findings.extend(_check_file(index, configs, package, path))
    if stages is not None:
        findings.extend(stage_findings(index, stages, package))
    kept = [f for f in findings if f.key not in allow]
    if report_stale:
        used = {f.key for f in findings}
        for key in sorted(allow):
            path = key.split(":", 1)[0]
            if key not in used and path in touched:
                kept.append(
                    Finding(
                        path,
                        0,
                        f"allowlist entry {key!r} matches nothing",
                        "series.toml [linkcheck.allow]",
                        key.split(":", 1)[1],
                    )
                )
    return sorted(set(kept), key=lambda f: (f.path, f.line, f.missing))


def _check_file(index: ClassIndex, configs: ConfigTypes, package: str, path: str) -> list[Finding]:
    module = ".".join([package, *path[: -len(".py")].split("/")])
    if module.endswith(".__init__"):
        module = module[: -len(".__init__")]
    info = index.module(module)
    if info is None or info.tree is None:
        why = info.error if info is not None and info.error else "not found in the overlay"
        return [Finding(path, 1, f"cannot check {module}", why, module)]
    checker = FileChecker(index, path, info, configs)
    checker.visit(info.tree)
    checker.check_self_reads()
    checker.check_unbound()
    return checker.findings


def package_root(pristine_root: Path, package: str = PACKAGE) -> Path:
    """The directory holding ``package/`` (accepts that dir or the package dir itself)."""
    pristine_root = Path(pristine_root)
    if (pristine_root / package / "__init__.py").is_file():
        return pristine_root
    if pristine_root.name == package and (pristine_root / "__init__.py").is_file():
        return pristine_root.parent
    raise BakeryError(f"no {package}/__init__.py under the pristine tree: {str(pristine_root)!r}")


def run_linkcheck(
    series: Series,
    pristine_root: Path,
    thirdparty_roots: list[Path],
    only: tuple[str, ...] = (),
    stages: Path | None = None,
) -> list[Finding]:
    """Apply the series (or ``only`` its named patches) in memory and check the result,
    with the names of the stages.toml in ``stages`` (default: the series' own folder)."""
    root = package_root(pristine_root)
    patches = series.select(only) if only else series.patches
    result = plan(root / PACKAGE, patches, max_fuzz=series.max_fuzz)
    overlay = {f"{PACKAGE}/{path}": data for path, data in result.after.items()}
    sources = SourceTree((root, *map(Path, thirdparty_roots)), overlay)
    return check_touched_files(
        sources,
        result.after,
        series.allow_names,
        report_stale=not only,
        stages=series.root if stages is None else stages,
    )
