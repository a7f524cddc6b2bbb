#!/usr/bin/env bash
# The image's entry point (Dockerfile): `run.sh start ARGS` (preflight, then vLLM), then
# follow the server's log in the foreground while it runs, so the container lives as long
# as the server; `docker stop` (SIGTERM) stops the server through the launcher.
#   container.sh --installed --python PY --profile NAME --model /models/... [flags] [-- vLLM args]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# stop and logs read the same run records as start: pass on its --artifacts.
where=()
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
    case "${args[i]}" in
        --) break ;;
        --artifacts) where=(--artifacts "${args[i + 1]:-}") ;;
        --artifacts=*) where=("${args[i]}") ;;
    esac
done
"$here/run.sh" start "$@"
trap '"$here/run.sh" stop "${where[@]}"; exit 0' TERM INT
"$here/run.sh" logs -f "${where[@]}" &
wait $!
