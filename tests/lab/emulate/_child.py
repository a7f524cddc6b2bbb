"""Run check functions of a tests/lab/emulate module in this (engine-like) interpreter.

Usage: ``python tests/lab/emulate/_child.py TREE MODULE:NAME...`` (``_emu.run_checks``).
Prints ``RESULT {"MODULE:NAME": {"ok", "kind", "detail"}}``; kind is "assert" for a failed
comparison and "error" for anything else.
"""

from __future__ import annotations

import importlib
import json
import sys
import traceback
from pathlib import Path

from _dcp_child import MARK


def main() -> None:
    tree, names = Path(sys.argv[1]), sys.argv[2:]
    out = {}
    for name in names:
        module, _, func = name.partition(":")
        try:
            getattr(importlib.import_module(module), func)(tree)
            out[name] = {"ok": True, "kind": "", "detail": ""}
        except AssertionError as exc:
            out[name] = {"ok": False, "kind": "assert", "detail": str(exc)[-2000:]}
        except Exception:
            out[name] = {"ok": False, "kind": "error", "detail": traceback.format_exc()[-4000:]}
    print(MARK + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
