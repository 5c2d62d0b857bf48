#!/usr/bin/env bash
# Stop the head started by start_head.sh, and only it: its processes are found by their temp dir
# (`ray stop` would kill every Ray process of the user).
set -euo pipefail
GCS_PORT=${GCS_PORT:-6379}
TEMP_DIR=${RAY_TEMP_DIR:-/tmp/ray-ctrlgen-$GCS_PORT}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
"${BIN:-$ROOT/.venv/bin}/python" - "$TEMP_DIR" "$GCS_PORT" <<'PY'
import os, sys, psutil
temp_dir, port = sys.argv[1], sys.argv[2]
me = {os.getpid(), os.getppid()}  # this script's own command line names the temp dir too
mine = [p for p in psutil.process_iter(["cmdline"])
        if p.pid not in me and any(temp_dir in a or f"--gcs_server_port={port}" in a or f"--gcs-address=127.0.0.1:{port}" in a
               for a in (p.info["cmdline"] or []))]
procs = {p.pid: p for p in mine}
for p in list(procs.values()):
    try:
        procs.update({c.pid: c for c in p.children(recursive=True)})
    except psutil.Error:
        pass
procs = {pid: p for pid, p in procs.items() if pid not in me}
for p in procs.values():
    try:
        p.terminate()
    except psutil.Error:
        pass
gone, alive = psutil.wait_procs(list(procs.values()), timeout=10)
for p in alive:
    p.kill()
print(f"stopped {len(procs)} Ray processes of {temp_dir}")
PY
