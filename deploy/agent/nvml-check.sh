#!/usr/bin/env bash
# Check the node health agent's NVML backend on a real GPU machine.
#
# Installs nothing and sends nothing: runs one check (`agent run --backend nvml --once`)
# with --print, so reports go to stdout instead of the API, and prints the readings (JSON)
# NVML and sysfs gave. Run from anywhere in a checkout that has its Python dependencies
# (pydantic, pydantic-settings, typer, httpx, nvidia-ml-py):
#
#   deploy/agent/nvml-check.sh                  # PYTHON=/path/to/python to pick one
#   EXPECTED_GPUS=8 EXPECTED_IB_RATE=400 deploy/agent/nvml-check.sh
#
# Exit: 0 no fault, 1 a fault found (the reports say which), 2 NVML unusable here.
set -uo pipefail

cd "$(dirname "$0")/../.." || exit 2
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
NODE=${NODE:-$(hostname -s 2>/dev/null || hostname)}
API=${API:-http://127.0.0.1:8000}  # not contacted: --print

echo "== host $(hostname), python $("$PYTHON" -c 'import sys; print(sys.version.split()[0])')"
"$PYTHON" - <<'PY' || true
try:
    import importlib.metadata as m
    print("== nvidia-ml-py", m.version("nvidia-ml-py"))
except Exception as e:  # noqa: BLE001 - informational only
    print("== nvidia-ml-py: not installed:", e)
PY
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=index,name,uuid,driver_version,fabric.state,fabric.status \
    --format=csv 2>/dev/null || nvidia-smi -L || true
else
  echo "== nvidia-smi not found"
fi
ls /sys/class/infiniband 2>/dev/null | sed 's/^/== HCA /' || true

args=(agent run --backend nvml --once --print --show-readings --node "$NODE" --api "$API")
[ -n "${EXPECTED_GPUS:-}" ] && args+=(--expected-gpus "$EXPECTED_GPUS")
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
[ -n "${EXPECTED_IB_RATE:-}" ] && export AUTOCLUSTERS_AGENT_EXPECTED_IB_RATE_GBPS="$EXPECTED_IB_RATE"

start=$(date +%s.%N)
"$PYTHON" -m clients.cli.agent "${args[@]}"
rc=$?
end=$(date +%s.%N)
echo "== one check: exit $rc in $(echo "$end - $start" | bc 2>/dev/null || echo '?') s" >&2
exit $rc
