#!/usr/bin/env bash
# The whole test suite in two tiers, each with its 20 slowest tests listed: the fast tier (unit tests,
# tiny in-process runs) first, then the slow tier (`@pytest.mark.slow`: CLI runs of tiny models). Both
# always run; the status is the first failure's. Extra arguments go to both pytest calls.
set -uo pipefail
cd "$(dirname "$0")/.."
status=0
echo "== fast tier: python -m pytest -m 'not slow'"
python -m pytest -m "not slow" --durations=20 "$@" || status=$?
echo "== slow tier: python -m pytest -m slow"
python -m pytest -m slow --durations=20 "$@" || { s=$?; [ "$status" -eq 0 ] && status=$s; }
exit "$status"
