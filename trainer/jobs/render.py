"""Text output of the job commands: kubectl-style tables and durations."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from trainer.errors import HUNG_AGAIN_EXIT, HUNG_EXIT
from trainer.jobs.events import EventView
from trainer.jobs.queue import Admission
from trainer.jobs.views import JobView, PodView


def table(header: Sequence[str], rows: Sequence[Sequence[str]], indent: str = "") -> str:
    """Left-aligned columns separated by three spaces, like kubectl's tables."""
    widths = [len(h) for h in header]
    for row in rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]
    lines = []
    for row in (header, *rows):
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=True)]
        lines.append(indent + "   ".join(cells).rstrip())
    return "\n".join(lines)


def age(since: dt.datetime | None, now: dt.datetime | None = None) -> str:
    """kubectl's short age: 45s, 12m, 3h4m, 2d5h."""
    if since is None:
        return "<unknown>"
    now = now or dt.datetime.now(dt.timezone.utc)
    return duration((now - since).total_seconds())


def duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 60:
        return f"{minutes}m"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{minutes}m" if minutes else f"{hours}h"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours}h" if hours else f"{days}d"


def job_table(jobs: Sequence[JobView], all_namespaces: bool, kinds: bool = False,
              admissions: dict[tuple[str, str, str], Admission] | None = None) -> str:
    """kubectl-style table; a KIND column when more than one kind is listed. A TrainJob whose
    node count its runtime decides shows "?" as the desired replicas. QUEUE and ADMISSION
    columns when a job names a Kueue queue (`admissions` by namespace, name, kind)."""
    queued = any(job.queue for job in jobs)
    header = ["NAME", "STATE", "AGE", "REPLICAS", "GPUS"]
    if queued:
        header += ["QUEUE", "ADMISSION"]
    if kinds:
        header.insert(1, "KIND")
    if all_namespaces:
        header.insert(0, "NAMESPACE")
    rows = []
    for job in jobs:
        desired = str(job.desired) if job.desired else "?"
        row = [job.name, job.state, age(job.created), f"{job.active}/{desired}", str(job.gpus)]
        if queued:
            found = (admissions or {}).get((job.namespace, job.name, job.kind))
            row += [job.queue or "-", found.state if found and job.queue else "-"]
        if kinds:
            row.insert(1, job.kind)
        if all_namespaces:
            row.insert(0, job.namespace)
        rows.append(row)
    return table(header, rows)


def trainer_status(job: JobView, now: dt.datetime | None = None) -> list[str]:
    """The lines of a TrainJob's status.trainerStatus (progress pushed by the trainer)."""
    ts = job.trainer_status
    if ts is None:
        return ["Progress:    <none reported: the trainer reports it when the controller runs "
                "with --feature-gates=TrainJobStatus=true>"]
    progress = "?" if ts.progress is None else f"{ts.progress}%"
    eta = "" if ts.remaining_seconds is None else f", about {duration(ts.remaining_seconds)} left"
    lines = [f"Progress:    {progress}{eta} (reported {age(ts.updated, now)} ago)"]
    if ts.metrics:
        lines.append("Trainer metrics:")
        lines.append(table(["NAME", "VALUE"], [list(m) for m in ts.metrics], indent="  "))
    return lines


def queue_lines(job: JobView, queued: Admission | None,
                since: dt.datetime | None = None) -> list[str]:
    """The job's Kueue queue and what Kueue says of it; nothing for a job without a queue."""
    if not job.queue:
        return []
    priority = f" (priority class {job.priority_class})" if job.priority_class else ""
    lines = [f"Queue:       {job.queue}{priority}"]
    if queued is not None:
        waited = f" for {age(since)}" if since is not None and queued.state in (
            "Pending", "Preempted", "Evicted") else ""
        lines.append(f"Admission:   {queued.state}{waited}: {queued.detail}")
        if queued.workload:
            lines.append(f"Workload:    {queued.workload} (kubectl describe workload "
                         f"{queued.workload} -n {job.namespace})")
    return lines


def job_status(job: JobView, pods: Sequence[PodView],
               events: Sequence[EventView] | str = (), queued: Admission | None = None,
               queued_since: dt.datetime | None = None) -> str:
    lines = [
        f"Name:        {job.name}",
        f"Kind:        {job.kind}",
        f"Namespace:   {job.namespace}",
        f"State:       {job.state}",
        f"Age:         {age(job.created)}",
        f"Suspended:   {'yes' if job.suspended else 'no'}",
        f"GPUs:        {job.gpus}",
    ]
    lines.append(f"Ranks/pod:   {job.ranks_per_pod}")
    lines += queue_lines(job, queued, queued_since)
    if job.kind == "TrainJob":
        lines.append(f"Runtime:     {job.runtime}")
        lines += trainer_status(job)
    lines.append("Replicas:")
    lines.append(
        table(
            ["TYPE", "DESIRED", "ACTIVE", "SUCCEEDED", "FAILED", "GPUS/REPLICA"],
            [
                [r.type, str(r.replicas or "?"), str(r.active), str(r.succeeded), str(r.failed),
                 str(r.gpus_per_replica)]
                for r in job.replicas
            ],
            indent="  ",
        )
    )
    lines.append("Conditions:")
    if job.conditions:
        lines.append(
            table(
                ["TYPE", "STATUS", "AGE", "REASON", "MESSAGE"],
                [
                    [c.type, c.status, age(c.last_transition), c.reason, c.message]
                    for c in job.conditions
                ],
                indent="  ",
            )
        )
    else:
        lines.append("  <none yet: the controller has not reconciled this job>")
    lines.append("Pods:")
    if pods:
        lines.append(
            table(
                ["RANKS", "NAME", "TYPE", "PHASE", "READY", "RESTARTS", "NODE", "AGE"],
                [
                    [p.rank_label, p.name, f"{p.replica_type}-{p.replica_index}",
                     p.waiting_reason or p.phase, "yes" if p.ready else "no",
                     str(p.restarts), p.node, age(p.started)]
                    for p in pods
                ],
                indent="  ",
            )
        )
    else:
        lines.append("  <none>")
    lines += terminations(pods)
    lines.append("Warnings:")
    if isinstance(events, str):
        lines.append(f"  <{events}>")
    elif events:
        lines.append(table(["AGE", "OBJECT", "REASON", "COUNT", "MESSAGE"],
                           [[age(e.last), f"{e.kind}/{e.name}", e.reason, str(e.count),
                             e.message] for e in events], indent="  "))
    else:
        lines.append("  <none>")
    return "\n".join(lines)


def terminations(pods: Sequence[PodView]) -> list[str]:
    """How each pod's trainer last ended: exit code, its class, the restarts and the
    termination message (the error line the trainer wrote, or the log's tail); no lines when
    no container has ended."""
    ended = [p for p in pods if p.terminated is not None]
    if not ended:
        return []
    lines = hung(ended)
    rows = []
    for pod in ended:
        t = pod.terminated
        assert t is not None
        rows.append([pod.name, pod.phase, str(t.exit_code), t.exit_class, str(pod.restarts),
                     "last run" if t.previous else "now", t.line])
    return [*lines, "Terminated:", table(["NAME", "PHASE", "EXIT", "CLASS", "RESTARTS", "WHEN",
                                          "MESSAGE"], rows, indent="  ")]


def hung(ended: Sequence[PodView]) -> list[str]:
    """``Hung: <the verdict>`` once, when a pod's trainer last ended by the hang watchdog
    (every pod of the job leaves the same verdict: docs/distributed.md, "Hangs")."""
    for pod in ended:
        t = next((t for t in (pod.terminated, pod.last_terminated)
                  if t is not None and t.exit_code in (HUNG_EXIT, HUNG_AGAIN_EXIT)), None)
        if t is not None:
            verdict = t.line.removeprefix("error: ").removeprefix("hang: ")
            when = "last run" if t.previous else "now"
            return [f"Hung:        {verdict} (exit {t.exit_code}, {pod.name}, {when})"]
    return []
