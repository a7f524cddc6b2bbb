"""Static link check of the files a series touches (being split into modules)."""

from bakery.check.linkcheck.classes import (
    Finding,
    SourceTree,
    check,
    format_finding,
    package_root,
    run_linkcheck,
)

__all__ = ["Finding", "SourceTree", "check", "format_finding", "package_root", "run_linkcheck"]
