"""The job commands. Each takes the parsed arguments and returns the process exit code;
problems are raised as JobsError (one line: problem and fix), which the CLI prints."""

from __future__ import annotations

import argparse
import re
import sys
import time
from typing import Any

from trainer.jobs import logs, prom, render
from trainer.jobs.errors import EXIT_FAILED, EXIT_SUCCEEDED, EXIT_TIMEOUT, JobsError
from trainer.jobs.kube import GROUP, PLURAL, VERSION, Cluster, Target, connect
from trainer.jobs.model import JobView, PodView, job_view, pod_view, rank_pods


def cluster_from(args: argparse.Namespace) -> Cluster:
    return connect(
        Target(
            kubeconfig=args.kubeconfig,
            context=args.context,
            namespace=args.namespace,
            request_timeout=args.request_timeout,
        )
    )


def get_job(cluster: Cluster, name: str) -> JobView:
    with cluster.errors(f"get pytorchjob {name}", job=name):
        return job_view(cluster.training.get_job(name, cluster.namespace,
                                                 timeout=cluster.timeout))


def get_pods(cluster: Cluster, job: JobView) -> list[PodView]:
    with cluster.errors(f"list the pods of pytorchjob {job.name}"):
        pods = cluster.training.get_job_pods(job.name, cluster.namespace,
                                             timeout=cluster.timeout)
    return rank_pods([pod_view(p) for p in pods], job.ranks_per_pod)


def cmd_list(args: argparse.Namespace) -> int:
    cluster = cluster_from(args)
    with cluster.errors("list pytorchjobs"):
        if args.all_namespaces:
            # TrainingClient lists one namespace only.
            raw = cluster.custom.list_cluster_custom_object(
                GROUP, VERSION, PLURAL, _request_timeout=cluster.timeout
            )
            models = [_deserialize(cluster, item) for item in raw.get("items", [])]
        else:
            models = cluster.training.list_jobs(cluster.namespace, timeout=cluster.timeout)
    jobs = sorted((job_view(m) for m in models), key=lambda j: (j.namespace, j.name))
    if not jobs:
        where = "any namespace" if args.all_namespaces else f"namespace {cluster.namespace!r}"
        print(f"No pytorchjobs in {where}.", file=sys.stderr)
        return 0
    print(render.job_table(jobs, all_namespaces=args.all_namespaces))
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    cluster = cluster_from(args)
    job = get_job(cluster, args.name)
    pods = get_pods(cluster, job)
    print(render.job_status(job, pods))
    if args.prometheus:
        sys.stdout.flush()
        metrics = prom.job_metrics(
            args.prometheus, job.name, job.namespace, window=args.rate_window,
            timeout=args.request_timeout,
        )
        print(prom.render(metrics, args.prometheus, job.name, job.namespace))
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    cluster = cluster_from(args)
    job = get_job(cluster, args.name)  # a clear "not found" instead of "no pods"
    pods = get_pods(cluster, job)
    if args.rank is not None:
        chosen = [p for p in pods if args.rank in p.ranks]
        if not chosen:
            known = ", ".join(p.rank_label for p in pods) or "none"
            raise JobsError(
                f"pytorchjob {args.name!r} has no pod with rank {args.rank} (ranks: {known})",
                "pick a rank from `status`, or leave out --rank for all ranks",
            )
        pods = chosen
    if not pods:
        print(f"pytorchjob {args.name!r} has no pods (suspended, finished and cleaned up, "
              "or not scheduled yet).", file=sys.stderr)
        return 0
    if args.follow:
        logs.follow(cluster, pods, args.tail, sys.stdout, sys.stderr)
    else:
        for line in logs.read_merged(cluster, pods, args.tail, sys.stderr):
            sys.stdout.write(line.prefix + line.text + "\n")
    return 0


def cmd_wait(args: argparse.Namespace) -> int:
    cluster = cluster_from(args)
    timeout = parse_duration(args.timeout)
    started = time.monotonic()
    deadline = started + timeout if timeout > 0 else None
    last_state = ""
    while True:
        job = get_job(cluster, args.name)
        if job.state != last_state:
            print(f"pytorchjob/{job.name} {job.state}", flush=True)
            last_state = job.state
        if job.state == "Succeeded":
            return EXIT_SUCCEEDED
        if job.state == "Failed":
            failed = job.condition("Failed")
            if failed is not None and (failed.reason or failed.message):
                print(f"  {failed.reason}: {failed.message}", file=sys.stderr)
            return EXIT_FAILED
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            print(
                f"timed out after {render.duration(now - started)}: pytorchjob/{job.name} is "
                f"still {job.state}", file=sys.stderr,
            )
            return EXIT_TIMEOUT
        pause = args.poll_interval if deadline is None else min(args.poll_interval,
                                                                 deadline - now)
        time.sleep(max(pause, 0.0))


def cmd_delete(args: argparse.Namespace) -> int:
    cluster = cluster_from(args)
    with cluster.errors(f"delete pytorchjob {args.name}", job=args.name):
        cluster.training.delete_job(args.name, cluster.namespace)
    print(f'pytorchjob.kubeflow.org "{args.name}" deleted')
    return 0


def cmd_suspend(args: argparse.Namespace) -> int:
    return _set_suspend(args, True)


def cmd_resume(args: argparse.Namespace) -> int:
    return _set_suspend(args, False)


def _set_suspend(args: argparse.Namespace, suspend: bool) -> int:
    cluster = cluster_from(args)
    job = get_job(cluster, args.name)
    verb = "suspended" if suspend else "resumed"
    if job.finished:
        raise JobsError(
            f"pytorchjob {args.name!r} already {job.state}; it cannot be {verb}",
            "submit a new job (the chart's `helm upgrade --install`) to train again",
        )
    if job.suspended == suspend:
        print(f"pytorchjob.kubeflow.org/{args.name} already {verb}")
        return 0
    # A merge patch of one field, as `kubectl patch --type merge` sends: the operator deletes
    # the pods on suspend and recreates them on resume (training resumes from a checkpoint).
    patch = {"spec": {"runPolicy": {"suspend": suspend}}}
    with cluster.errors(f"{'suspend' if suspend else 'resume'} pytorchjob {args.name}",
                        job=args.name):
        cluster.training.update_job(patch, args.name, cluster.namespace)
    print(f"pytorchjob.kubeflow.org/{args.name} {verb}")
    return 0


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


def parse_duration(text: str) -> float:
    """kubectl-style durations: "90", "90s", "15m", "1h30m"; 0 means no limit."""
    text = text.strip()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise JobsError(
            f"--timeout {text!r} is not a duration", 'use e.g. "90s", "30m", "2h", or 0 for none'
        )
    return sum(float(n) * _UNITS[u] for n, u in parts)


def _deserialize(cluster: Cluster, item: dict[str, Any]) -> Any:
    # Reuse TrainingClient's model mapping so -A yields the same typed jobs as one namespace.
    from kubeflow.training.constants import constants
    from kubeflow.training.utils import utils

    return cluster.training.api_client.deserialize(
        utils.FakeResponse(item), constants.JOB_PARAMETERS[constants.PYTORCHJOB_KIND]["model"]
    )
