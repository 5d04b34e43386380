#!/usr/bin/env bash
# `make test`: every test, the real cluster's included, on this project's 2-core machines.
#
# 1. The cluster (two nodes, the second reserved for the two-node tests: tests/cluster/
#    reserve.py) comes up in the background, its build and start-up times printed when it is
#    ready, and then tests/cluster runs there, one test at a time, on the first node. Every test
#    outside tests/cluster runs meanwhile on two pytest-xdist workers, a file per worker at a
#    time: those keep both cores busy, and the cluster tests leave about a third of the CPU idle
#    alone (their jobs wait on the kubelet, the operators, Prometheus).
# 2. Once those are done, the two-node tests (tests/cluster/test_two_nodes.py) run beside what
#    is left of tests/cluster: they assert outcomes, not timings, and mostly wait on the nodes
#    (NotReady, eviction, a partition's timeout). The tests that restart the API server or an
#    operator run first in tests/cluster and never beside them.
# 3. The cluster goes down, whatever the outcome, and fails the run if it leaves anything behind
#    on either node (processes, mounts, namespaces, links, cgroups, iptables chains).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
export PATH="$PWD/.tools/bin:$PATH"
mkdir -p .cache
up_log=.cache/cluster-up.log
rest_log=.cache/cluster-tests.log
ready=.cache/cluster-ready
TWO_NODES=tests/cluster/test_two_nodes.py
rm -f "$ready"

{
    { "$PY" -m tools.cluster up --nodes 2 && "$PY" -m tests.cluster.reserve; } >"$up_log" 2>&1 \
        || exit 10
    touch "$ready"
    "$PY" -m pytest -q -p no:cacheprovider --durations=15 tests/cluster --ignore "$TWO_NODES" \
        >"$rest_log" 2>&1 || exit 11
} &
background=$!
status=0
"$PY" -m pytest -q -n 2 --dist loadfile --durations=15 --ignore=tests/cluster || status=$?
# The two-node tests once the cluster is up (here, it always is by now when caches are warm).
while [ ! -e "$ready" ] && kill -0 "$background" 2>/dev/null; do sleep 2; done
if [ -e "$ready" ]; then
    "$PY" -m pytest -q -p no:cacheprovider --durations=5 "$TWO_NODES" || status=1
fi
wait "$background"
background_status=$?
cat "$up_log"
if [ "$background_status" = 10 ]; then
    echo "run-tests: the cluster did not come up (its log above); tests/cluster not run" >&2
    status=1
else
    cat "$rest_log"
    [ "$background_status" = 0 ] || status=1
fi
"$PY" -m tools.cluster down || status=1
exit "$status"
