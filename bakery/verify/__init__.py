"""The parity harness: does a DCPn server answer like the DCP1 server?

capture (server -> bundle directory) -> compare (two bundles -> report dict under
gates) -> report (JSON + Markdown); calibrate turns repeated baseline captures into
gate thresholds. The CLI lives in ``bakery.cli.verify``; the parity matrix
(``bakery.parity``) calls ``capture_bundle`` and ``compare_bundles``.
"""

from bakery.verify.bundle import Bundle, load_bundle
from bakery.verify.calibrate import calibrate_bundles
from bakery.verify.capture import CaptureSettings, ServerInfo, capture_bundle
from bakery.verify.compare import ParityGates, compare_bundles, load_gates
from bakery.verify.report import render_markdown, write_reports
from bakery.verify.suite import load_suite

__all__ = [
    "Bundle",
    "CaptureSettings",
    "ParityGates",
    "ServerInfo",
    "calibrate_bundles",
    "capture_bundle",
    "compare_bundles",
    "load_bundle",
    "load_gates",
    "load_suite",
    "render_markdown",
    "write_reports",
]
