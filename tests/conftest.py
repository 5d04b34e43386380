"""Shared helpers: run the real CLI in subprocesses (real torch.distributed, gloo, CPU)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.s3 import SeaweedS3  # at module level: the slow marking below follows it

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 240,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m trainer ARGS` in a clean environment (no inherited RANK/WORLD_SIZE)."""
    base = {k: v for k, v in os.environ.items()
            if k not in {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"}
            and not k.startswith(("PET_", "TORCHELASTIC_"))}
    base["PYTHONPATH"] = str(REPO)
    base.update(env or {})
    return subprocess.run([sys.executable, "-m", "trainer", *args], cwd=cwd or REPO, env=base,
                          capture_output=True, text=True, timeout=timeout, check=False)


def read_json(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


@pytest.fixture
def cli() -> Any:
    return run_cli


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real S3 server (SeaweedFS, tests/support/s3.py) with its bucket made; stopped after
    the module. Its build failing fails the test with the build's error."""
    with SeaweedS3(tmp_path_factory.mktemp("s3")) as server:
        yield server


# -- test tiers --------------------------------------------------------------------------------
# `make test-fast` runs `pytest -m "not slow"`: unit and in-process tests. A test is marked
# slow here when it lives under a directory whose tests drive external binaries (helm, podman,
# the image build), or when it — its own code, the module's helpers it calls, or the fixtures
# it requests — starts processes (our CLI, ranks, Prometheus). A test may also say so itself
# with @pytest.mark.slow. `make test` runs everything.
BINARY_DIRS = frozenset({"e2e", "image", "chart", "examples", "cluster"})
STARTS_PROCESSES = frozenset({"run_cli", "subprocess", "Popen", "spawn", "start_processes",
                              "multiprocessing", "Process", "mp"})


def _codes(code: Any) -> Any:
    """`code` and the code of the functions and lambdas defined inside it."""
    yield code
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            yield from _codes(const)


def _starts_processes(obj: Any, seen: set[int], depth: int = 0) -> bool:
    """Whether `obj` (a function, or a class's methods) or a test helper it names starts
    processes, following names through the test modules' globals a few calls deep."""
    if id(obj) in seen or depth > 4:
        return False
    seen.add(id(obj))
    if isinstance(obj, type):
        return any(_starts_processes(v, seen, depth + 1) for v in vars(obj).values())
    func = getattr(obj, "__func__", obj)
    func = getattr(func, "__wrapped__", func)
    code = getattr(func, "__code__", None)
    if code is None:
        return False
    names = {n for c in _codes(code) for n in c.co_names}
    if names & STARTS_PROCESSES:
        return True
    module = getattr(func, "__globals__", {})
    for name in names:
        target = module.get(name)
        where = getattr(target, "__module__", "") or ""
        ours = where.startswith(("tests", "conftest", "test_")) or where == module.get("__name__")
        if ours and _starts_processes(target, seen, depth + 1):
            return True
    return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tests = REPO / "tests"
    for item in items:
        if item.get_closest_marker("slow"):
            continue
        parts = item.path.relative_to(tests).parts if item.path.is_relative_to(tests) else ()
        slow = bool(parts) and parts[0] in BINARY_DIRS
        if not slow:
            seen: set[int] = set()
            fixtures = getattr(item, "_fixtureinfo", None)
            defs = fixtures.name2fixturedefs.values() if fixtures is not None else ()
            slow = _starts_processes(getattr(item, "obj", None), seen) or any(
                _starts_processes(d[-1].func, seen) for d in defs if d)
        if slow:
            item.add_marker(pytest.mark.slow)
