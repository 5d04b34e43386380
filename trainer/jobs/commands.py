"""The job commands. Each takes the parsed arguments and returns the process exit code;
problems are raised as JobsError (one line: problem and fix), which the CLI prints."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from trainer.jobs import fetch, logs, prom, queue, render
from trainer.jobs.arguments import check_namespace, parse_duration
from trainer.jobs.errors import (
    EXIT_FAILED,
    EXIT_SUCCEEDED,
    EXIT_TIMEOUT,
    AmbiguousJob,
    JobsError,
)
from trainer.jobs.events import job_events
from trainer.jobs.kinds import CHOICES, LABEL_JOBSET, LABEL_RJOB, TRAINER_RJOB, TRAINJOB, Kind
from trainer.jobs.kube import Cluster, Target, connect, job_not_found
from trainer.jobs.views import JobView, PodView, job_view, pod_view, rank_pods, with_pod_counts


def cluster_from(args: argparse.Namespace) -> Cluster:
    """The cluster of the kubeconfig (or service account), once the flags are checked
    (:func:`trainer.jobs.arguments.check`, run by the CLI before every command)."""
    cluster = connect(
        Target(
            kubeconfig=args.kubeconfig,
            context=args.context,
            namespace=args.namespace or None,
            request_timeout=args.request_timeout,
        )
    )
    if not args.namespace:
        check_namespace(cluster.namespace, "the kubeconfig context's")
    return cluster


def requested(args: argparse.Namespace) -> tuple[Kind, ...]:
    return CHOICES[getattr(args, "kind", "all")]


def find_job(cluster: Cluster, name: str, kinds: tuple[Kind, ...]) -> tuple[Kind, JobView]:
    """The one job called `name` among the served `kinds` (a name may exist in both)."""
    from kubernetes.client.exceptions import ApiException

    served = cluster.served(kinds)
    found: list[tuple[Kind, JobView]] = []
    for kind in served:
        with cluster.errors(f"get {kind.singular} {name}", kind, name):
            try:
                found.append((kind, job_view(cluster.get(kind, name))))
            except ApiException as exc:
                if exc.status != 404:
                    raise
    if not found:
        raise job_not_found(name, cluster.namespace, served)
    if len(found) > 1:
        raise AmbiguousJob(
            f'both a pytorchjob and a trainjob are called "{name}" in namespace '
            f'"{cluster.namespace}"', "pick one with --kind pytorchjob or --kind trainjob")
    return found[0]


def get_pods(cluster: Cluster, kind: Kind, job: JobView) -> list[PodView]:
    with cluster.errors(f"list the pods of {kind.singular} {job.name}", kind):
        pods = cluster.pods(kind.pod_selector(job.name))
    return rank_pods([pod_view(p, kind) for p in pods], job.ranks_per_pod)


def cmd_list(args: argparse.Namespace) -> int:
    cluster = cluster_from(args)
    kinds = cluster.served(requested(args))
    jobs: list[JobView] = []
    for kind in kinds:
        with cluster.errors(f"list {kind.plural}", kind):
            views = [job_view(obj) for obj in cluster.list_jobs(kind, args.all_namespaces)]
        if kind is TRAINJOB and views:
            views = _with_running_nodes(cluster, views, args.all_namespaces)
        jobs += views
    jobs.sort(key=lambda j: (j.namespace, j.name, j.kind))
    if not jobs:
        where = "any namespace" if args.all_namespaces else f"namespace {cluster.namespace!r}"
        print(f"No {' or '.join(k.plural for k in kinds)} in {where}.", file=sys.stderr)
        return 0
    with cluster.errors("list the Kueue workloads (workloads.kueue.x-k8s.io)"):
        queued = queue.admissions(cluster, jobs, args.all_namespaces)
    print(render.job_table(jobs, all_namespaces=args.all_namespaces, kinds=len(kinds) > 1,
                           admissions={key: a for key, (a, _) in queued.items()}))
    return 0


def _with_running_nodes(cluster: Cluster, jobs: list[JobView],
                        all_namespaces: bool) -> list[JobView]:
    # One pod list for all TrainJobs: their status counts child Jobs, not pods.
    with cluster.errors("list the pods of the trainjobs", TRAINJOB):
        pods = cluster.pods(f"{LABEL_JOBSET},{LABEL_RJOB}={TRAINER_RJOB}", all_namespaces)
    by_job: dict[tuple[str, str], list[PodView]] = {}
    for pod in pods:
        key = (str(pod.metadata.namespace), str((pod.metadata.labels or {})[LABEL_JOBSET]))
        by_job.setdefault(key, []).append(pod_view(pod, TRAINJOB))
    return [with_pod_counts(j, by_job.get((j.namespace, j.name), [])) for j in jobs]


def cmd_status(args: argparse.Namespace) -> int:
    cluster = cluster_from(args)
    kind, job = find_job(cluster, args.name, requested(args))
    pods = get_pods(cluster, kind, job)
    with cluster.errors("list the Kueue workloads (workloads.kueue.x-k8s.io)"):
        queued, since = queue.admissions(cluster, [job]).get(
            (job.namespace, job.name, job.kind), (None, None))
    print(render.job_status(with_pod_counts(job, pods), pods,
                            job_events(cluster, kind, job, pods), queued, since))
    if args.prometheus:
        sys.stdout.flush()
        metrics = prom.job_metrics(
            args.prometheus, job.name, job.namespace, kind=kind.name, window=args.rate_window,
            timeout=args.request_timeout,
        )
        print(prom.render(metrics, args.prometheus, job.name, job.namespace, kind.name))
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    cluster = cluster_from(args)
    kind, job = find_job(cluster, args.name, requested(args))  # "not found", not "no pods"
    pods = get_pods(cluster, kind, job)
    if args.rank is not None:
        chosen = [p for p in pods if args.rank in p.ranks]
        if not chosen:
            known = ", ".join(p.rank_label for p in pods) or "none"
            raise JobsError(
                f"{kind.singular} {args.name!r} has no pod with rank {args.rank} "
                f"(ranks: {known})",
                "pick a rank from `status`, or leave out --rank for all ranks",
            )
        pods = chosen
    if not pods:
        print(f"{kind.singular} {args.name!r} has no pods (suspended, finished and cleaned "
              "up, or not scheduled yet).", file=sys.stderr)
        return 0
    if args.follow:
        logs.follow(cluster, pods, args.tail, sys.stdout, sys.stderr)
    else:
        for line in logs.read_merged(cluster, pods, args.tail, sys.stderr):
            sys.stdout.write(line.shown() + "\n")
    return 0


def cmd_wait(args: argparse.Namespace) -> int:
    cluster = cluster_from(args)
    timeout = parse_duration(args.timeout)
    started = time.monotonic()
    deadline = started + timeout if timeout > 0 else None
    last_state = ""
    kinds = requested(args)
    while True:
        kind, job = find_job(cluster, args.name, kinds)
        kinds = (kind,)  # found once: keep polling that kind only
        if job.kind == TRAINJOB.name and not job.finished and not job.suspended:
            job = with_pod_counts(job, get_pods(cluster, kind, job))  # Running or Pending
        if job.state != last_state:
            print(f"{kind.singular}/{job.name} {job.state}", flush=True)
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
                f"timed out after {render.duration(now - started)}: {kind.singular}/{job.name} "
                f"is still {job.state}", file=sys.stderr,
            )
            return EXIT_TIMEOUT
        pause = args.poll_interval if deadline is None else min(args.poll_interval,
                                                                 deadline - now)
        time.sleep(max(pause, 0.0))


def cmd_delete(args: argparse.Namespace) -> int:
    cluster = cluster_from(args)
    kind, _ = find_job(cluster, args.name, requested(args))
    with cluster.errors(f"delete {kind.singular} {args.name}", kind, args.name):
        cluster.delete(kind, args.name)
    print(f'{kind.singular}.{kind.group} "{args.name}" deleted')
    return 0


def cmd_suspend(args: argparse.Namespace) -> int:
    return _set_suspend(args, True)


def cmd_resume(args: argparse.Namespace) -> int:
    return _set_suspend(args, False)


def _set_suspend(args: argparse.Namespace, suspend: bool) -> int:
    cluster = cluster_from(args)
    kind, job = find_job(cluster, args.name, requested(args))
    verb = "suspended" if suspend else "resumed"
    if job.finished:
        raise JobsError(
            f"{kind.singular} {args.name!r} already {job.state}; it cannot be {verb}",
            "submit a new job (the chart's `helm upgrade --install`) to train again",
        )
    if job.suspended == suspend:
        print(f"{kind.singular}.{kind.group}/{args.name} already {verb}")
        return 0
    # A merge patch of one field, as `kubectl patch --type merge` sends: the controller
    # deletes the pods on suspend and recreates them on resume (training resumes from a
    # checkpoint). A PyTorchJob without spec.runPolicy gets one holding just `suspend`.
    with cluster.errors(f"{'suspend' if suspend else 'resume'} {kind.singular} {args.name}",
                        kind, args.name):
        cluster.merge_patch(kind, args.name, kind.suspend_patch(suspend))
    print(f"{kind.singular}.{kind.group}/{args.name} {verb}")
    return 0


def cmd_fetch(args: argparse.Namespace) -> int:
    cluster = cluster_from(args)
    kind, job = find_job(cluster, args.name, requested(args))
    if not job.finished:
        print(f"warning: {kind.singular} {args.name} has not finished ({job.state}): its "
              "outputs may be partial or absent", file=sys.stderr)
    with cluster.errors(f"get {kind.singular} {args.name}", kind, args.name):
        raw = cluster.get(kind, args.name)
    source = fetch.fetch(cluster, kind, raw, Path(args.to))
    files = sorted(p for p in Path(args.to).rglob("*") if p.is_file())
    print(f"fetched {len(files)} files of {kind.singular} {args.name} from {source} "
          f"into {args.to}")
    return 0
