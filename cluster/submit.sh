#!/usr/bin/env bash
# Thin wrapper of `ctrlgen submit` for the head started by start_head.sh (its token, its dashboard port):
#   cluster/submit.sh synthesize -c configs/generate_tiny.yaml output_dir=/data/out
#   cluster/submit.sh extract -c configs/extract_demo.yaml demo_corpus.n_notes=1000000 --no-wait
# Any `ctrlgen submit` option may follow (see `ctrlgen submit --help`).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${BIN:-$ROOT/.venv/bin}
RAY_STATE=${RAY_STATE:-${CTRLGEN_CACHE:-$HOME/.cache/ctrlgen}/ray}
DASHBOARD_PORT=${DASHBOARD_PORT:-8265}
[ $# -ge 1 ] || { echo "usage: cluster/submit.sh VERB -c CONFIG [key.sub=value ...] [--no-wait]" >&2; exit 2; }
cd "$ROOT"
exec "$BIN/python" -m ctrlgen.cli submit "$@" --address "http://127.0.0.1:$DASHBOARD_PORT" \
  --token-file "$RAY_STATE/auth_token"
