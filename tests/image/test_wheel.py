"""The image's Python contents without Docker: build the wheel with the Dockerfile's own
command from exactly the files its COPY lines take, install it into a fresh venv, and run the
entrypoint like the container would (HOME and caches as the image's ENV sets them).

torch is not downloaded again: the fresh venv gets a ``.pth`` line naming the project venv's
site-packages, so the project's already installed dependencies are importable. (``venv
--system-site-packages`` would expose the base interpreter's packages, not the project venv's.)
A plain path line does not process the ``.pth`` files in that directory, so the project's
editable install of ``trainer`` stays invisible and the tests run the wheel's copy.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tools.imagebuild.dockerfile import REPO, parse
from trainer import __version__


@dataclass(frozen=True)
class Installed:
    venv: Path
    wheel: Path
    env: dict[str, str]
    scratch: Path

    def bin(self, name: str) -> str:
        return str(self.venv / "bin" / name)

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(args), capture_output=True, text=True, env=self.env,
                              cwd=self.scratch, timeout=timeout, check=False)


def wheel_stage_build(context: Path, dist: Path) -> None:
    """Copy what the wheel stage COPYs (minus .dockerignore'd caches), run its build RUN."""
    stage = parse().stage("wheel")
    for copy in stage.all("COPY"):
        *sources, _dest = copy.words()
        for source in sources:
            src = REPO / source
            assert src.exists(), f"the Dockerfile copies {source}, which does not exist"
            if src.is_dir():
                shutil.copytree(src, context / source,
                                ignore=shutil.ignore_patterns("__pycache__", "*.py[cod]"))
            else:
                shutil.copy2(src, context / source)
    build = next(r.args for r in stage.all("RUN") if "pip wheel" in r.args)
    command = build.replace("/dist", str(dist))
    # `python` is the project venv's (it has the builder's setuptools and wheel); VERSION is
    # the build argument `make image` passes.
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "VERSION": __version__}
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", command], cwd=context, env=env,
                            capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, f"{command}\n{result.stdout}\n{result.stderr}"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    root = tmp_path_factory.mktemp("image")
    context, dist = root / "context", root / "dist"
    context.mkdir()
    wheel_stage_build(context, dist)
    wheels = list(dist.glob("*.whl"))
    assert [w.name for w in wheels] == [f"ddp_trainer-{__version__}-py3-none-any.whl"]

    target = root / "venv"
    venv.EnvBuilder(with_pip=False, symlinks=True).create(target)  # the project's pip installs
    fresh = subprocess.run([str(target / "bin" / "python"), "-c",
                            "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                           capture_output=True, text=True, check=True)
    project = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    Path(fresh.stdout.strip(), "project-venv.pth").write_text("\n".join(sorted(project)) + "\n")

    # The image's ENV, with its /tmp moved into this test's scratch directory.
    scratch = root / "tmp"
    scratch.mkdir()
    image_env = {k: v.replace("/tmp", str(scratch)) for k, v in parse().final.env().items()}
    dropped = {"PYTHONPATH", "VIRTUAL_ENV", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
               "MASTER_PORT"}
    env = {k: v for k, v in os.environ.items()
           if k not in dropped and not k.startswith(("PET_", "TORCHELASTIC_"))}
    env.update(image_env)
    env["PATH"] = f"{target / 'bin'}{os.pathsep}{os.environ['PATH']}"

    result = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(target / "bin" / "python"), "install",
         "--no-index", "--no-deps", "--force-reinstall", str(wheels[0])],
        capture_output=True, text=True, env=env, timeout=300, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    yield Installed(target, wheels[0], env, scratch)


def test_the_wheel_carries_the_package_and_both_console_scripts(installed: Installed) -> None:
    import zipfile

    names = zipfile.ZipFile(installed.wheel).namelist()
    assert "trainer/cli.py" in names and "trainer/jobs/cli.py" in names
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(installed.wheel).read(entry_points).decode()
    assert "ddp-trainer = trainer.cli:main" in text
    assert "kubectl-ddp = trainer.jobs.cli:kubectl_main" in text
    assert not any("tests/" in n or n.endswith(".pyc") for n in names)


def test_the_fresh_venv_runs_the_wheels_copy_not_the_checkout(installed: Installed) -> None:
    result = installed.run(installed.bin("python"), "-c", "import trainer; print(trainer.__file__)")
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()).is_relative_to(installed.venv), result.stdout


def test_entrypoint_help(installed: Installed) -> None:
    result = installed.run(installed.bin("ddp-trainer"), "--help")
    assert result.returncode == 0, result.stderr
    for command in ("train", "run", "evaluate", "jobs"):
        assert command in result.stdout
    version = installed.run(installed.bin("ddp-trainer"), "--version")
    assert version.stdout.strip().endswith(__version__)


def test_kubectl_plugin_is_installed_with_the_package(installed: Installed) -> None:
    result = installed.run(installed.bin("kubectl-ddp"), "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: kubectl ddp")


def test_one_training_step_with_the_images_environment(installed: Installed) -> None:
    out = installed.scratch / "outputs"
    result = installed.run(installed.bin("ddp-trainer"), "train", "--dataset", "synthetic",
                           "--max-steps", "1", "--output-dir", str(out), "--metrics-port", "0")
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 1
