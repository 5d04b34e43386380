#!/usr/bin/env bash
# `make test`: every test, the real cluster's included, on this project's 2-core machines.
#
# 1. The cluster comes up in the background (its build and start-up times are printed when it
#    is ready) while every test outside tests/cluster runs on two pytest-xdist workers, a file
#    per worker at a time: those tests keep both cores busy, so two workers take about 70 % of
#    the time of one (README, Development).
# 2. tests/cluster then runs alone, one test at a time: its alert and stall tests time real
#    jobs, which would slow down beside other tests; alone they leave about half the CPU idle.
# 3. The cluster goes down, whatever the outcome.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
export PATH="$PWD/.tools/bin:$PATH"
mkdir -p .cache
up_log=.cache/cluster-up.log

"$PY" -m tools.cluster up >"$up_log" 2>&1 &
up=$!
status=0
"$PY" -m pytest -q -n 2 --dist loadfile --durations=15 --ignore=tests/cluster || status=$?
if wait "$up"; then
    cat "$up_log"
    "$PY" -m pytest -q --durations=15 tests/cluster || status=$?
else
    cat "$up_log"
    echo "run-tests: the cluster did not come up (its log above); tests/cluster not run" >&2
    status=1
fi
"$PY" -m tools.cluster down
exit "$status"
