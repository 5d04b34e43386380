"""The image itself: built by podman from our Dockerfile (CPU variant, local Debian base,
local wheel index; tools/imagebuild/image.py), then run and inspected."""

from __future__ import annotations

import hashlib

import pytest

from tools.imagebuild.dockerfile import REPO, parse
from tools.imagebuild.image import BuiltImage
from tools.imagebuild.podman import Podman

# How the chart runs the container (values.yaml securityContext), as podman flags.
RESTRICTED = ("--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
              "--network", "none")


def run(podman: Podman, image: BuiltImage, *args: str, entrypoint: str | None = None) -> str:
    flags = ["--entrypoint", entrypoint] if entrypoint else []
    proc = podman.run("run", "--rm", *RESTRICTED, *flags, image.ref, *args, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_it_runs_as_uid_and_gid_10001(podman: Podman, image: BuiltImage) -> None:
    assert podman.image_inspect(image.ref)["Config"]["User"] == "10001:10001"
    ids = run(podman, image, "-c", "id -u; id -g; id -G", entrypoint="/bin/sh")
    assert ids.split() == ["10001", "10001", "10001"]


def test_version_works_with_a_read_only_root_and_no_capabilities(
        podman: Podman, image: BuiltImage) -> None:
    assert run(podman, image, "--version").strip() == f"ddp-trainer {image.version}"


def test_the_entrypoint_is_ddp_trainer_and_the_labels_carry_the_version(
        podman: Podman, image: BuiltImage) -> None:
    config = podman.image_inspect(image.ref)["Config"]
    assert config["Entrypoint"] == ["ddp-trainer"]
    assert config["Labels"]["org.opencontainers.image.version"] == image.version
    assert "usage: ddp-trainer" in run(podman, image)  # CMD ["--help"]


def test_the_final_stage_has_no_compilers_pip_cache_or_build_files(
        podman: Podman, image: BuiltImage) -> None:
    # (The base's own ensurepip wheels in /usr/share/python-wheels are not build files.)
    script = ("for c in gcc cc g++ c++ clang make; do command -v $c; done; "
              "ls -d /root/.cache /tmp/.cache /src /dist /wheels 2>/dev/null; "
              "find / -xdev \\( -path '*/.cache/pip' -o -path '*/pip/http*' "
              "-o -name 'ddp_trainer-*.whl' -o -name '*.egg-info' \\) -print 2>/dev/null; "
              "true")
    found = run(podman, image, "-c", script, entrypoint="/bin/sh")
    assert found.strip() == ""


def test_the_writable_paths_belong_to_the_user(podman: Podman, image: BuiltImage) -> None:
    out = run(podman, image, "-c", "stat -c '%u:%g %n' /outputs /checkpoints",
              entrypoint="/bin/sh")
    assert out.split("\n")[:2] == ["10001:10001 /outputs", "10001:10001 /checkpoints"]


def test_the_environment_is_the_dockerfiles(podman: Podman, image: BuiltImage) -> None:
    env = dict(line.split("=", 1) for line in
               run(podman, image, entrypoint="env").splitlines() if "=" in line)
    for key, value in parse().final.env().items():
        assert env[key] == value, key


def test_image_size_is_reported(podman: Podman, image: BuiltImage,
                                capsys: pytest.CaptureFixture[str]) -> None:
    size = int(podman.image_inspect(image.ref)["Size"])
    assert size == image.size_bytes > 0
    with capsys.disabled():
        built = f"built in {image.build_seconds:.0f} s" if image.build_seconds else "cached"
        print(f"\n[image] {image.ref}: {size / 2**20:.0f} MiB (CPU variant, {built})")


def test_the_installed_package_is_this_checkouts_trainer(podman: Podman, image: BuiltImage) -> None:
    """Not a stale build: every module in the image is byte for byte the working tree's."""
    script = ("import hashlib, pathlib, trainer; root = pathlib.Path(trainer.__file__).parent\n"
              "for p in sorted(root.rglob('*.py')):\n"
              "    print(p.relative_to(root), hashlib.sha256(p.read_bytes()).hexdigest())")
    installed = dict(line.split() for line in
                     run(podman, image, "-c", script, entrypoint="python").splitlines())
    source = REPO / "trainer"
    checkout = {str(p.relative_to(source)): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(source.rglob("*.py"))}
    assert installed == checkout
