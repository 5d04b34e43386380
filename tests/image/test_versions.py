"""One version and one image name across Makefile, chart, Dockerfile and package."""

from __future__ import annotations

import re
import subprocess

import yaml

from tools.imagebuild.dockerfile import REPO, parse
from trainer import __version__

CHART = REPO / "charts" / "ddp-trainer"


def make_image_command() -> tuple[str, str, str]:
    """(repository, tag, VERSION build arg) of the command `make image` would run."""
    result = subprocess.run(["make", "-n", "image"], cwd=REPO, capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    match = re.search(r"docker build -t (\S+):(\S+) --build-arg VERSION=(\S+) \.$",
                      result.stdout.strip(), re.MULTILINE)
    assert match, result.stdout
    return match.group(1), match.group(2), match.group(3)


def test_make_image_tags_the_package_version_and_passes_it_as_build_arg() -> None:
    _, tag, version = make_image_command()
    assert tag == version == __version__


def test_chart_pulls_the_image_make_builds() -> None:
    repository, tag, _ = make_image_command()
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert values["image"]["repository"] == repository
    assert chart["appVersion"] == tag  # the default tag when values image.tag is empty
    assert values["image"]["tag"] in ("", tag)


def test_chart_runs_the_images_user_with_a_read_only_root() -> None:
    uid, _, gid = parse().final.all("USER")[-1].args.partition(":")
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for context in (values["podSecurityContext"], values["securityContext"]):
        assert str(context["runAsUser"]) == uid
        assert str(context["runAsGroup"]) == gid
    assert values["securityContext"]["readOnlyRootFilesystem"] is True


def test_image_source_label_is_the_charts_source() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    label = parse().final.labels()["org.opencontainers.image.source"]
    assert label in chart["sources"]
    assert chart["annotations"]["licenses"] == parse().final.labels()[
        "org.opencontainers.image.licenses"]


def test_the_examples_build_on_the_image_of_this_version() -> None:
    # The Dockerfile's default base and the README's --build-arg BASE=<your registry>/...:<tag>.
    readme = (REPO / "README.md").read_text()
    dockerfile = (REPO / "examples" / "mytask" / "Dockerfile").read_text()
    for text, pattern in (
        (readme, r"--build-arg BASE=\S+/ddp-trainer:(\S+)"),
        (dockerfile, r"^ARG BASE=ghcr\.io/ddp-trainer/ddp-trainer:(\S+)$"),
    ):
        tags = re.findall(pattern, text, re.MULTILINE)
        assert tags == [__version__], tags
