"""The Go builds of the test cluster and the S3 server: one build of a module at a time on a
machine, however many processes ask for it (`make test` starts SeaweedFS's in the background
while its tests and the cluster's start may ask too). Builds a tiny module of our own."""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

import pytest

from tools.cluster import builds


@pytest.fixture
def hello(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> builds.Group:
    module = tmp_path / "hello"
    module.mkdir()
    (module / "go.mod").write_text("module example.com/hello\n\ngo 1.22\n")
    (module / "main.go").write_text('package main\n\nfunc main() { println("hello") }\n')
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return builds.Group("hello", module, (("hello", "."),), static=True)


def test_a_second_builder_waits_for_the_first_and_takes_its_binary(
        hello: builds.Group) -> None:
    versions = builds.Versions.read()
    go = builds._go()
    out = builds.cache_folder(hello, go, hello.ldflags(versions))
    out.parent.mkdir(parents=True)
    results: list[Path] = []
    with builds._locked(out.with_name(out.name + ".lock")):  # a build under way elsewhere
        second = threading.Thread(target=lambda: results.append(builds.build(hello, versions)))
        second.start()
        second.join(timeout=3)
        # it waits: no folder of its own half-written beside the first builder's
        assert second.is_alive() and not out.with_name(out.name + ".partial").exists()
    second.join(timeout=120)
    assert results == [out]
    assert subprocess.run([out / "hello"], capture_output=True, text=True).stderr == "hello\n"
    assert builds.build(hello, versions) == out  # built once: the next caller takes it
