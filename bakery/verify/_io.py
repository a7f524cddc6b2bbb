"""Atomic file writes shared by bundles and reports.

A reader never sees a half-written file: the text goes to a temporary file in
the same directory (same filesystem) and is moved into place with ``os.replace``.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["write_text_atomic", "write_json_atomic"]


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that ``path`` is either old or complete."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, data: Any, *, sort_keys: bool, strict: bool = False) -> None:
    """Write ``data`` as indented JSON.

    Reports sort keys so two runs diff cleanly; server responses must not, because
    ``top_logprobs`` order is meaningful (the top-1 margin is first minus second).
    ``strict`` (reports, gates) refuses NaN and infinities, which are not JSON: a
    report that held one would be a bug, never a result.
    """
    text = json.dumps(data, indent=2, sort_keys=sort_keys, ensure_ascii=False, allow_nan=not strict)
    write_text_atomic(path, text + "\n")
