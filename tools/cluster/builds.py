"""Builds the cluster's components from their Go modules (pinned in the go.mod files beside
this file) into a per-version cache outside the clone.

A cache folder is named by a hash of its module's go.mod, go.sum and sources and of the Go
version, so a pin bump builds anew and anything else reuses what a machine built once.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tools.cluster.layout import (
    COREDNS_MODULE,
    HERE,
    KUEUE_MODULE,
    LOCAL_PATH_MODULE,
    PROMETHEUS_MODULE,
    PROMETHEUS_OPERATOR_MODULE,
    TRAINER_V2_MODULE,
    TRAINING_OPERATOR_MODULE,
    Versions,
    binaries_cache,
    kueue_wanted,
)


@dataclass(frozen=True)
class Group:
    """One Go module of ours and the binaries built from it."""

    name: str
    """Its binaries' cache folder is `name`-<key>: a name of its own, not the module folder's,
    so that renaming a folder does not orphan what a machine built (a cold build of every
    module takes ~25 minutes on 2 cores)."""
    module: Path
    packages: tuple[tuple[str, str], ...]  # (binary name, package path)
    static: bool = False  # no cgo: the binary goes into a FROM-scratch image
    tags: str = ""  # go build -tags
    optional: bool = False  # an add-on the cluster runs without under KUEUE=0

    def ldflags(self, versions: Versions) -> str:
        if self.name == "localpath":  # what its release build stamps
            return f"-s -w -X main.VERSION={versions.local_path}"
        if self.module != HERE:
            return "-s -w"
        major, minor = versions.kubernetes.lstrip("v").split(".")[:2]
        stamp = "k8s.io/component-base/version"
        # What `--version` and `kubectl version` print (the release scripts stamp the same).
        return (f"-s -w -X {stamp}.gitVersion={versions.kubernetes} -X {stamp}.gitMajor={major}"
                f" -X {stamp}.gitMinor={minor}")


K8S = "k8s.io/kubernetes/cmd/"
GROUPS = (
    Group("cluster", HERE, (("kube-apiserver", K8S + "kube-apiserver"),
                 ("kube-controller-manager", K8S + "kube-controller-manager"),
                 ("kube-scheduler", K8S + "kube-scheduler"), ("kubelet", K8S + "kubelet"),
                 ("kubectl", K8S + "kubectl"),
                 ("etcd", "./cmd/etcd"))),
    # Apart from the others of its module, so that adding it kept their cached build.
    Group("kubeproxy", HERE, (("kube-proxy", K8S + "kube-proxy"),)),
    Group("coredns", COREDNS_MODULE, (("coredns", "."),)),
    Group("localpath", LOCAL_PATH_MODULE, (
        ("local-path-provisioner", "github.com/rancher/local-path-provisioner"),)),
    Group("training", TRAINING_OPERATOR_MODULE, (
        ("training-operator", "github.com/kubeflow/training-operator/cmd/training-operator.v1"),)),
    Group("trainer", TRAINER_V2_MODULE, (
        ("trainer-controller-manager",
         "github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager"),
        ("jobset-controller", "sigs.k8s.io/jobset"))),
    Group("monitoring", PROMETHEUS_OPERATOR_MODULE, (
        ("prometheus-operator", "github.com/prometheus-operator/prometheus-operator/cmd/operator"),
        ("prometheus-config-reloader",
         "github.com/prometheus-operator/prometheus-operator/cmd/prometheus-config-reloader")),
        static=True),
    # Only the Kubernetes service discovery of Prometheus' plugins (its build tags).
    Group("prometheus", PROMETHEUS_MODULE, (
        ("prometheus", "github.com/prometheus/prometheus/cmd/prometheus"),),
          static=True, tags="remove_all_sd,enable_kubernetes_sd"),
    # Last: the optional add-on, so that its failing build comes after every other's.
    Group("kueue", KUEUE_MODULE, (("kueue", "sigs.k8s.io/kueue/cmd/kueue"),), optional=True),
)


class BuildError(RuntimeError):
    """A Go build failed; the message has the command and the output's tail."""


def _go() -> str:
    go = shutil.which("go") or ("/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").exists()
                                else None)
    if go is None:
        raise BuildError("go not found (fix: install Go >= 1.26, the version the go.mod files "
                         "name, and put it on PATH)")
    return go


def key(group: Group, go: str, ldflags: str) -> str:
    h = hashlib.sha256(subprocess.run([go, "version"], capture_output=True, text=True,
                                      check=True).stdout.encode() + ldflags.encode()
                       + (b"static" if group.static else b"") + group.tags.encode())
    for path in sorted(p for p in group.module.iterdir()
                       if p.suffix in (".mod", ".sum") or p.name == "cmd"):
        files = sorted(path.rglob("*.go")) if path.is_dir() else [path]
        for f in files:
            h.update(str(f.relative_to(group.module)).encode() + b"\0" + f.read_bytes())
    for f in sorted(group.module.glob("*.go")):
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def cache_folder(group: Group, go: str, ldflags: str) -> Path:
    """Where the group's binaries are kept: its own name and the key, never its folder's name."""
    return binaries_cache() / f"{group.name}-{key(group, go, ldflags)}"


def module_dir(module: str, cwd: Path) -> Path:
    """The source folder of `module` at the version the go.mod in `cwd` pins (`go mod download`
    fetches it into the module cache once): where release manifests are read from."""
    proc = subprocess.run([_go(), "mod", "download", "-json", module], cwd=cwd,
                          capture_output=True, text=True, check=True)
    return Path(json.loads(proc.stdout)["Dir"])


def build(group: Group, versions: Versions) -> Path:
    """The folder holding the group's binaries, built if this machine has not yet. One build
    of a group at a time: `make test` starts SeaweedFS's in the background while its tests
    (two pytest workers) and the cluster's start may each ask for it, and two builders would
    delete each other's `.partial` folder."""
    go = _go()
    ldflags = group.ldflags(versions)
    out = cache_folder(group, go, ldflags)
    if _built(group, out):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with _locked(out.with_name(out.name + ".lock")):
        if _built(group, out):  # built by whoever held the lock before
            return out
        return _build(group, go, ldflags, out)


def _built(group: Group, out: Path) -> bool:
    return all((out / name).is_file() for name, _ in group.packages)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # released when the file closes, or the process ends
        yield


def _build(group: Group, go: str, ldflags: str, out: Path) -> Path:
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    command = [go, "build", "-trimpath", "-ldflags", ldflags, "-o", str(tmp)]
    if group.tags:
        command += ["-tags", group.tags]
    command += [pkg for _, pkg in group.packages]
    started = time.monotonic()
    print(f"cluster: building {', '.join(n for n, _ in group.packages)} "
          f"(go build in {os.path.relpath(group.module, HERE.parents[1])})", flush=True)
    env = {**os.environ, "GOFLAGS": "-mod=readonly -buildvcs=false"}
    if group.static:
        env["CGO_ENABLED"] = "0"
    proc = subprocess.run(command, cwd=group.module, env=env, capture_output=True, text=True,
                          check=False)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-4000:]
        if group.optional:
            raise BuildError(
                f"the optional add-on {group.name} ({group.module.name}/go.mod) did not build "
                f"(fix: pin a version that builds there, docs/cluster.md; or KUEUE=0 to run "
                f"the cluster without it): {' '.join(command)} failed:\n{tail}")
        raise BuildError(f"{' '.join(command)} failed:\n{tail}")
    for name, pkg in group.packages:  # go build -o DIR names a binary after its package
        built = tmp / (Path(pkg).name if pkg != "." else group.name)
        if not (tmp / name).exists() and built.exists():
            built.rename(tmp / name)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    for older in out.parent.glob(f"{group.name}-*"):  # earlier pins of this module
        if older != out and older.suffix != ".lock":
            shutil.rmtree(older, ignore_errors=True)
    print(f"cluster: built in {time.monotonic() - started:.0f} s -> {out}", flush=True)
    return out


def binary(name: str) -> Path | None:
    """Where this machine built `name` at the pinned version, if it has."""
    versions = Versions.read()
    for group in GROUPS:
        if name in dict(group.packages):
            path = cache_folder(group, _go(), group.ldflags(versions)) / name
            return path if path.is_file() else None
    return None


def wanted_groups() -> tuple[Group, ...]:
    return tuple(g for g in GROUPS if not g.optional or kueue_wanted())


def build_all(versions: Versions) -> dict[str, Path]:
    """Binary name -> path, for every component."""
    binaries: dict[str, Path] = {}
    for group in wanted_groups():
        folder = build(group, versions)
        binaries.update({name: folder / name for name, _ in group.packages})
    return binaries


if __name__ == "__main__":
    for name, path in build_all(Versions.read()).items():
        print(name, path)
    sys.exit(0)
