"""Logs of a job's pods, one line per log line, each prefixed with the pod's training rank(s).

Without --follow every pod's log is read with kubelet timestamps and the pods are merged by
time, so lines of different ranks appear in the order they were written. With --follow one
thread per pod streams its log and the lines are printed as they arrive.
"""

from __future__ import annotations

import codecs
import datetime as dt
import heapq
import queue
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TextIO

from trainer.jobs.kube import Cluster
from trainer.jobs.views import PodView


@dataclass(frozen=True)
class Line:
    prefix: str
    text: str

    def shown(self) -> str:
        # The trainer's own lines already start with "[rank r] " (seen on a real cluster): say
        # it once.
        return self.text if self.text.startswith(self.prefix) else self.prefix + self.text


def prefix(pod: PodView) -> str:
    # With several ranks per pod the trainer's own lines also carry "[rank r]" (non-zero r).
    return f"[rank {pod.rank_label}] " if pod.ranks_per_pod == 1 else f"[ranks {pod.rank_label}] "


def read_merged(cluster: Cluster, pods: list[PodView], tail: int | None, err: TextIO) -> list[Line]:
    """Every pod's log, merged by kubelet timestamp (ties keep rank order)."""
    streams: list[list[tuple[tuple[int, int], int, int, Line]]] = []
    for order, pod in enumerate(pods):
        body = _read(cluster, pod, tail=tail, follow=False, timestamps=True, err=err)
        if body is None:
            continue
        entries = []
        text = bytes(body.data).decode("utf-8", errors="replace")
        for seq, raw in enumerate(text.splitlines()):
            stamp, message = split_timestamp(raw)
            entries.append((stamp, order, seq, Line(prefix(pod), message)))
        streams.append(entries)
    return [entry[3] for entry in heapq.merge(*streams)]


def follow(cluster: Cluster, pods: list[PodView], tail: int | None, out: TextIO,
           err: TextIO) -> None:
    """Stream all pods' logs until every stream ends (the pods terminate) or Ctrl-C."""
    lines: queue.Queue[Line | None] = queue.Queue()
    responses: list[Any] = []
    for pod in pods:
        body = _read(cluster, pod, tail=tail, follow=True, timestamps=False, err=err)
        if body is None:
            continue
        responses.append(body)
        thread = threading.Thread(
            target=_pump, args=(body, prefix(pod), lines), name=f"logs-{pod.name}", daemon=True
        )
        thread.start()
    running = len(responses)
    try:
        while running:
            line = lines.get()
            if line is None:
                running -= 1
                continue
            out.write(line.shown() + "\n")
            out.flush()
    finally:
        for body in responses:
            body.release_conn()


def _pump(body: Any, line_prefix: str, lines: queue.Queue[Line | None]) -> None:
    try:
        for text in iter_lines(body.stream(None)):
            lines.put(Line(line_prefix, text))
    except Exception as exc:  # noqa: BLE001 - the stream ended badly; say so and stop this pod
        lines.put(Line(line_prefix, f"<log stream ended: {exc}>"))
    finally:
        lines.put(None)


def iter_lines(chunks: Iterable[bytes]) -> Iterator[str]:
    """Split a byte stream into text lines, keeping a partial last line until it ends."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    pending = ""
    for chunk in chunks:
        pending += decoder.decode(chunk)
        *complete, pending = pending.split("\n")
        yield from (line.rstrip("\r") for line in complete)
    pending += decoder.decode(b"", final=True)
    if pending:
        yield pending


FOLLOW_SILENCE_S = 7 * 24 * 3600.0
"""How long a followed log may go without a line before the read gives up."""


def split_timestamp(raw: str) -> tuple[tuple[int, int], str]:
    """Split kubelet's RFC 3339 nanosecond prefix: ((unix seconds, nanoseconds), message).

    The fraction has a varying number of digits, so the stamps are parsed, not compared as text.
    """
    stamp, _, message = raw.partition(" ")
    try:
        whole, _, fraction = stamp.rstrip("Z").partition(".")
        seconds = dt.datetime.fromisoformat(whole).replace(tzinfo=dt.timezone.utc).timestamp()
        nanos = int((fraction + "000000000")[:9]) if fraction else 0
        return (int(seconds), nanos), message
    except ValueError:
        return (0, 0), raw  # not stamped (should not happen): keep the line, sort it first


def _read(cluster: Cluster, pod: PodView, *, tail: int | None, follow: bool, timestamps: bool,
          err: TextIO) -> Any:
    """Open a pod's log; None (with a note on stderr) when the container has no log yet."""
    from kubernetes.client.exceptions import ApiException

    kwargs: dict[str, Any] = {
        "container": pod.container,
        "follow": follow,
        "timestamps": timestamps,
        # Undecoded: the client would json.loads() a log that looks like JSON.
        "_preload_content": False,
    }
    if tail is not None:
        kwargs["tail_lines"] = tail
    # Connect within the timeout; a followed log may then be silent for up to a week
    # (kubernetes >= 37 validates the pair and refuses None, "no read timeout").
    kwargs["_request_timeout"] = (cluster.timeout, FOLLOW_SILENCE_S if follow else cluster.timeout)
    with cluster.errors(f"read the log of pod {pod.name}"):
        try:
            return cluster.core.read_namespaced_pod_log(pod.name, cluster.namespace, **kwargs)
        except ApiException as exc:
            if exc.status != 400:  # 400: the container is not running yet (or gone)
                raise
            err.write(f"{prefix(pod)}no log yet: {_message(exc)}\n")
            err.flush()
            return None


def _message(exc: Any) -> str:
    import json

    try:
        return str(json.loads(exc.body).get("message") or exc.reason)
    except (TypeError, ValueError, AttributeError):
        return str(exc.reason)
