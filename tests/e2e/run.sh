#!/usr/bin/env bash
# The e2e tier (`make test-e2e`, called by .ci/run after the unit tests): verl 0.9.1's real
# `python -m verl.trainer.main_ppo` with verl-gdro on CPU, in the pinned, separate .venv-e2e.
# A test harness, not a way to train on CPU: see docs/e2e.md.
#
#   bash tests/e2e/run.sh [extra pytest args]
#   E2E_WORK_DIR=/tmp/e2e bash tests/e2e/run.sh   # keep the runs' logs, metrics and checkpoints
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT="$PWD"
VENV="${E2E_VENV:-$ROOT/.venv-e2e}"
T0=$(date +%s)

bash tests/e2e/setup_env.sh
T1=$(date +%s)

cleanup() {
  # Each main_ppo tears down the local Ray cluster it started; this catches a run killed midway.
  "$VENV/bin/ray" stop --force >/dev/null 2>&1 || true
}
trap cleanup EXIT

export VLLM_TARGET_DEVICE=cpu VLLM_CPU_KVCACHE_SPACE=1 PYTHONUNBUFFERED=1
# Inside run.sh a missing e2e environment is a failure, never a skip.
export E2E_REQUIRED=1
set +e
"$VENV/bin/python" -m pytest tests/e2e -m e2e -v -p no:cacheprovider --durations=0 "$@"
RC=$?
set -e
T2=$(date +%s)
echo "[e2e] environment: $((T1 - T0)) s, tests: $((T2 - T1)) s, total: $((T2 - T0)) s (exit $RC)"
exit $RC
