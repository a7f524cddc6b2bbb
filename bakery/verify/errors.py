"""The parity harness's own failures, each a ``bakery.errors.BakeryError``.

Exit codes are the project's (README): 1 is a parity failure or work that
failed (a server that never answered), 2 is bad input (an unreadable bundle, a
suite that does not parse, bundles that cannot be compared). The split lets a
script or CI tell "the candidate diverged" from "the harness was misused".
"""

from __future__ import annotations

from bakery.errors import BakeryError

__all__ = ["BundleError", "SuiteError", "CaptureError", "ParityFailure", "GatesError"]


class BundleError(BakeryError):
    """A bundle directory or file that cannot be read as a bundle."""

    exit_code = 2


class SuiteError(BakeryError):
    """A prompt suite that does not exist or does not parse."""

    exit_code = 2


class GatesError(BakeryError):
    """A gates file or gate value that is malformed."""

    exit_code = 2


class CaptureError(BakeryError):
    """The server did not give a usable answer, after retries."""

    exit_code = 1


class ParityFailure(BakeryError):
    """The candidate does not answer like the baseline under the gates."""

    exit_code = 1
