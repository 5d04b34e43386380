#!/usr/bin/env bash
# `make test`: every test, the real cluster's included, on this project's 2-core machines.
#
# 1. The cluster (two nodes, the second reserved for the two-node tests: tests/cluster/
#    reserve.py) comes up in the background (its build and start-up times are printed when it
#    is ready) while the tests outside tests/cluster run on two pytest-xdist workers, a file
#    per worker at a time: those tests keep both cores busy, so two workers take about 70 % of
#    the time of one (docs/development.md). Once the cluster is up, the two-node tests
#    (tests/cluster/test_two_nodes.py) run beside them in the background too: they assert
#    outcomes, not timings, and mostly wait on the nodes (NotReady, eviction, a partition's
#    timeout).
# 2. The rest of tests/cluster then runs (once the cluster is up: on a fresh machine, whose
#    Go builds outlast the other tests, beside the two-node tests), one test at a time, on
#    the first node. It leaves a
#    third of the cores idle (it waits on pods, operators and scrapes), so LATER, the longest
#    whole-run tests outside tests/cluster with no timing of their own, run beside it as
#    SCHED_IDLE: they take only what the cluster tests leave. At equal priority the cluster
#    tests slowed from 17 to 24 min; at `nice 10` an alert test timed out (2026-12-06).
# 3. The cluster goes down, whatever the outcome, and fails the run if it leaves anything behind
#    on either node (processes, mounts, namespaces, links, cgroups, iptables chains).
# SeaweedFS (the S3 server of the object-storage tests) is built first, in the background: on a
# fresh machine its build takes 22 min, mostly fetching its modules (6 min of CPU), and whoever
# needs it first waits for that one build (tools/cluster/builds.py locks it).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
export PATH="$PWD/.tools/bin:$PATH"
mkdir -p .cache
up_log=.cache/cluster-up.log
two_log=.cache/cluster-two-nodes.log
TWO_NODES=tests/cluster/test_two_nodes.py
later_log=.cache/later.log
LATER=(tests/examples/test_mytask.py tests/examples/test_causal_lm.py
       tests/test_readme_commands.py tests/test_training.py tests/data/test_images.py tests/data/test_tables.py tests/sampling/test_sampler_resume.py
       tests/robustness/test_nothing_lost.py tests/test_launch_trainer_v2.py
       tests/metrics/test_trainjob_status_run.py tests/test_fsdp.py tests/test_sharded_checkpoint.py)

s3_log=.cache/s3server-build.log
"$PY" -m tools.s3server >"$s3_log" 2>&1 &
s3_build=$!
# The cluster's state reaches this shell through a pipe opened read-write here (so the writer
# never blocks): the rest of tests/cluster waits for the cluster, not for the two-node tests,
# which on a fresh machine (the cluster's Go builds outlast the other tests) run beside them.
up_pipe=.cache/cluster-up.pipe
rm -f "$up_pipe" && mkfifo "$up_pipe" && exec 3<>"$up_pipe"
{
    if { "$PY" -m tools.cluster up --nodes 2 && "$PY" -m tests.cluster.reserve; } \
        >"$up_log" 2>&1; then
        echo up >&3
    else
        echo down >&3
        exit 10
    fi
    "$PY" -m pytest -q -p no:cacheprovider --durations=5 "$TWO_NODES" >"$two_log" 2>&1 || exit 11
} &
background=$!
status=0
"$PY" -m pytest -q -n 2 --dist loadfile --durations=15 --ignore=tests/cluster \
    "${LATER[@]/#/--ignore=}" || status=$?
read -r cluster_state <&3
cat "$up_log"
chrt --idle 0 "$PY" -m pytest -q -p no:cacheprovider --durations=5 "${LATER[@]}" \
    >"$later_log" 2>&1 &
later=$!
if [ "$cluster_state" != up ]; then
    echo "run-tests: the cluster did not come up (its log above); tests/cluster not run" >&2
    status=1
else
    "$PY" -m pytest -q --durations=15 tests/cluster --ignore "$TWO_NODES" || status=$?
fi
wait "$background"
up_and_two=$?
[ "$up_and_two" = 10 ] || cat "$two_log"
[ "$up_and_two" = 0 ] || status=1
wait "$later" || status=1
cat "$later_log"
"$PY" -m tools.cluster down || status=1
exec 3>&-
rm -f "$up_pipe"
wait "$s3_build" || status=1
echo "SeaweedFS build (tools.s3server):"; cat "$s3_log"
exit "$status"
