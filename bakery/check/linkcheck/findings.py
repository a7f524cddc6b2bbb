"""What linkcheck reports: one unresolved link per Finding, and its one-line form."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Finding:
    """One unresolved link: ``path:line: missing (where)``; ``subject`` keys the allowlist."""

    path: str  # as the series names it (relative to the vllm/ package)
    line: int
    missing: str
    where: str
    subject: str

    @property
    def key(self) -> str:
        return f"{self.path}:{self.subject}"


def format_finding(f: Finding) -> str:
    return f"{f.path}:{f.line}: {f.missing} ({f.where})"
