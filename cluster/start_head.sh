#!/usr/bin/env bash
# Start a Ray head node on this machine: dashboard on 127.0.0.1, token authentication on.
#   cluster/start_head.sh                 # then: cluster/submit.sh configs/extract_demo.yaml
# Env: RAY_STATE (token + temp dir root), GCS_PORT, DASHBOARD_PORT, NUM_CPUS, and AGENT_PORT (the
# node's dashboard-agent HTTP port, which serves job submission; Ray's default 52365). Two Ray nodes
# on one machine (a head and a test's private cluster) must not share it: the second agent cannot
# bind, and every submission then fails with "No available agent to submit job".
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${BIN:-$ROOT/.venv/bin}
RAY_STATE=${RAY_STATE:-${CTRLGEN_CACHE:-$HOME/.cache/ctrlgen}/ray}
GCS_PORT=${GCS_PORT:-6379}
DASHBOARD_PORT=${DASHBOARD_PORT:-8265}
AGENT_PORT=${AGENT_PORT:-52365}
# Logical CPUs above the physical ones: avoids the read-task deadlocks of RAY_NOTES.
NUM_CPUS=${NUM_CPUS:-$(( $(nproc) + 2 ))}
mkdir -p "$RAY_STATE" && chmod 700 "$RAY_STATE"
TOKEN="$RAY_STATE/auth_token"
if [ ! -s "$TOKEN" ]; then
  (umask 077 && "$BIN/python" -c 'import secrets; print(secrets.token_hex(32))' > "$TOKEN")
fi
export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH="$TOKEN"
# Submitted jobs run `python -m ctrlgen.cli ...` with the head's PATH: this environment's python first.
export PATH="$BIN:$PATH"
# Socket paths must stay under 107 bytes: keep the temp dir short.
TEMP_DIR=${RAY_TEMP_DIR:-/tmp/ray-ctrlgen-$GCS_PORT}
"$BIN/ray" start --head --port="$GCS_PORT" --num-cpus="$NUM_CPUS" \
  --include-dashboard=true --dashboard-host=127.0.0.1 --dashboard-port="$DASHBOARD_PORT" \
  --dashboard-agent-listen-port="$AGENT_PORT" \
  --temp-dir="$TEMP_DIR" --disable-usage-stats
echo "head started: dashboard http://127.0.0.1:$DASHBOARD_PORT (send 'Authorization: Bearer <token>'; token file $TOKEN)"
echo "temp dir $TEMP_DIR; stop with: cluster/stop_head.sh"
