"""The job commands' flags and names, checked before any request: a value the API server or
Prometheus would misread (an empty name fetches the job list; a negative --tail shows
nothing; a window is pasted into PromQL) is one line naming the flag and the fix."""

from __future__ import annotations

import argparse
import math
import re
import urllib.parse

from trainer.jobs.errors import BadArgument

# Kubernetes' object names (DNS-1123 subdomain; k8s.io/apimachinery validation.IsDNS1123Subdomain)
# and namespace names (DNS-1123 label, IsDNS1123Label).
_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_SUBDOMAIN = re.compile(rf"{_LABEL}(\.{_LABEL})*")
_NAMESPACE = re.compile(_LABEL)
# Prometheus' durations (model.ParseDuration): units largest first, each at most once.
_PROM_DURATION = re.compile(r"(\d+y)?(\d+w)?(\d+d)?(\d+h)?(\d+m)?(\d+s)?(\d+ms)?")
# kubectl's durations for --timeout: "90", "90s", "15m", "1h30m".
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


def check(args: argparse.Namespace) -> None:
    """Every flag and name of the parsed command that the server would not judge right."""
    name = getattr(args, "name", None)
    if name is not None and not (len(name) <= 253 and _SUBDOMAIN.fullmatch(name)):
        raise BadArgument(
            f"job name {shown(name)} is not a Kubernetes object name (lowercase letters, digits, "
            "'-' and '.', at most 253)", "pass the NAME that `ddp-trainer jobs list` shows")
    if args.namespace:  # "" is unset, as kubectl takes it
        check_namespace(args.namespace, "-n/--namespace")
    check_seconds("--request-timeout", args.request_timeout)
    if getattr(args, "poll_interval", None) is not None:
        check_seconds("--poll-interval", args.poll_interval)
    if getattr(args, "timeout", None) is not None:
        parse_duration(args.timeout)
    if getattr(args, "tail", None) is not None and args.tail < 0:
        raise BadArgument(f"--tail {args.tail} is negative",
                          "pass 0 or more lines, or leave out --tail for every line")
    if getattr(args, "prometheus", None) is not None:
        check_url(args.prometheus)
    window = getattr(args, "rate_window", None)
    if window is not None and not (window and _PROM_DURATION.fullmatch(window)
                                   and re.search(r"[1-9]", window)):
        raise BadArgument(f"--rate-window {window!r} is not a Prometheus duration",
                          'pass a positive one, e.g. "1m", "30s" or "1h30m"')


def shown(text: str) -> str:
    """`text` quoted, its first 40 characters only when it is longer than 60."""
    return repr(text) if len(text) <= 60 else f"{text[:40]!r}... ({len(text)} characters)"


def check_namespace(namespace: str, source: str) -> None:
    if not (len(namespace) <= 63 and _NAMESPACE.fullmatch(namespace)):
        raise BadArgument(
            f"namespace {shown(namespace)} ({source}) is not a namespace name (lowercase letters, "
            "digits and '-', at most 63)", "pass the namespace as `kubectl get namespaces` "
            "shows it")


def check_url(url: str) -> None:
    why = "is not an http(s) URL"
    try:
        parts = urllib.parse.urlsplit(url)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname)
        parts.port  # noqa: B018 - raises ValueError for a port out of range
    except ValueError as exc:  # "Invalid IPv6 URL", "Port out of range 0-65535"
        ok, why = False, f"is not a valid URL ({exc})"
    if not ok:
        raise BadArgument(f"--prometheus {shown(url)} {why}",
                          "pass its base URL, e.g. --prometheus http://127.0.0.1:9090")


MAX_SECONDS = 365 * 24 * 3600.0
"""Longest duration flag taken (a year): Python's and the HTTP client's timers overflow far
above it (1e300 was reported as the API server's failure)."""


def check_seconds(flag: str, value: float) -> None:
    """A duration flag of the job commands: finite, > 0 and at most :data:`MAX_SECONDS`."""
    if not (math.isfinite(value) and 0 < value <= MAX_SECONDS):
        raise BadArgument(f"{flag} {value:g} is not a number of seconds > 0 and at most "
                          f"{MAX_SECONDS:.0f} (a year)",
                          f"pass {flag} a positive number, e.g. {flag} 30")


def parse_duration(text: str) -> float:
    """kubectl-style durations: "90", "90s", "15m", "1h30m"; 0 means no limit."""
    text = text.strip()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise BadArgument(
            f"--timeout {text!r} is not a duration", 'use e.g. "90s", "30m", "2h", or 0 for none'
        )
    return sum(float(n) * _UNITS[u] for n, u in parts)
