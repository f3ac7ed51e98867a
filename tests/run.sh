#!/usr/bin/env bash
# The whole test suite in two tiers, each with its 20 slowest tests listed: the fast tier (unit tests,
# tiny in-process runs) first, then the slow tier (`@pytest.mark.slow`: CLI runs of tiny models). Both
# always run; the status is the first failure's. Extra arguments go to both pytest calls (a tier they
# leave without tests counts as passed). Each tier runs on HYBRIDRL_TEST_WORKERS pytest-xdist workers
# (default 2: CI's 2 cores; most tests wait on Python and subprocesses, so two at a time take ~0.7 of
# the serial time); 0 runs them in this process, one after another.
set -uo pipefail
cd "$(dirname "$0")/.."
status=0
tier() {
  echo "== $1 tier: python -m pytest -m '$2'"
  python -m pytest -m "$2" -n "${HYBRIDRL_TEST_WORKERS:-2}" --durations=20 "${@:3}"
  local s=$?
  if [ "$s" -ne 0 ] && [ "$s" -ne 5 ] && [ "$status" -eq 0 ]; then status=$s; fi  # 5: no tests selected
}
tier fast "not slow" "$@"
tier slow "slow" "$@"
exit "$status"
