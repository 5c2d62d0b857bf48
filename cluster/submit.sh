#!/usr/bin/env bash
# Submit the extraction job to the head started by start_head.sh (same machine or a node that
# has this repository and its .venv at the same path).
#   cluster/submit.sh configs/extract_demo.yaml demo_corpus.n_notes=1000000 output_dir=/data/out
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${BIN:-$ROOT/.venv/bin}
RAY_STATE=${RAY_STATE:-${CTRLGEN_CACHE:-$HOME/.cache/ctrlgen}/ray}
DASHBOARD_PORT=${DASHBOARD_PORT:-8265}
CONFIG=${1:?usage: cluster/submit.sh CONFIG [key.sub=value ...]}
shift
export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH="$RAY_STATE/auth_token"
args=$(printf " %q" "$@")
entry="cd $(printf %q "$ROOT") && $(printf %q "$BIN/python") -m ray_jobs.extract -c $(printf %q "$CONFIG")$args ray.address=auto"
# A head that has just started may not have its job agent yet: Ray answers 500 "No available
# agent to submit job, please try again later" and no job is created, so that case is retried.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for attempt in $(seq 1 30); do
  set +e
  "$BIN/ray" job submit --address "http://127.0.0.1:$DASHBOARD_PORT" --entrypoint-num-cpus=0 \
    -- bash -c "$entry" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  set -e
  if [ "$rc" -eq 0 ] || ! grep -q "No available agent" "$log"; then
    exit "$rc"
  fi
  echo "submit.sh: the head's job agent is not up yet; retrying in 2 s (attempt $attempt of 30)" >&2
  sleep 2
done
exit "$rc"
