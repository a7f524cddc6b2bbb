#!/usr/bin/env bash
# Serve the baked dcp2 tree: a thin door onto `bakery.cli.launch` (as `python -m bakery.launch`).
#   run.sh start|stop|restart|status [--profile NAME|FILE] [--dry-run] [flags] [-- vLLM args]
#   run.sh profiles                                         (every profile, with its description)
#   run.sh logs [--profile NAME] [-f] [-n N]                (the newest run's server log)
#   run.sh matrix [--matrix FILE] [--baseline BUNDLE_DIR]   (the DCP parity matrix)
# Profiles: launcher/dcp2/profiles/*.toml. Every check, the record and the
# process-group lifecycle live in bakery/launch/; see `run.sh start --help`.
# The Python: $BAKERY_PYTHON, else the repo's .venv (made by `make bake`/`make test`).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
py="${BAKERY_PYTHON:-$repo/.venv/bin/python}"
if [[ ! -x "$py" ]]; then
    echo "error: no Python to run the launcher (not executable): $py" >&2
    echo "hint: run \`make bake\` to create .venv, or set BAKERY_PYTHON" >&2
    exit 2
fi
# bakery may or may not be installed in that Python: import it from this checkout.
export BAKERY_ROOT="$repo"
exec "$py" -c 'import sys; sys.path.insert(0, sys.argv.pop(1)); from bakery.cli.launch import main; sys.exit(main(sys.argv[1:]))' "$repo" "$@"
