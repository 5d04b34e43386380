"""`make release REGISTRY=host:port [REGISTRY_CA=ca.crt]`: the image and the chart pushed to an
OCI registry, the path a user's CI takes.

- The image: the checkout's Dockerfile built with podman (the CPU variant, air-gapped, on a
  debootstrapped base: tools/imagebuild/image.py; no other registry can be pulled here),
  pushed as `REGISTRY/ddp-trainer:<version>`, the tag the chart's appVersion names;
- the chart: `helm package` + `helm push` to `oci://REGISTRY/charts`.

Then `helm install NAME oci://REGISTRY/charts/ddp-trainer --version <chart version>
--set image.repository=REGISTRY/ddp-trainer` runs that image. Exit 0, or 2 with one line
naming what failed.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "charts" / "ddp-trainer"
HELM = REPO / ".tools" / "bin" / "helm"
sys.path.insert(0, str(REPO))
from tools.imagebuild.image import trainer_image  # noqa: E402
from tools.imagebuild.podman import Podman, PodmanError  # noqa: E402


class ReleaseError(RuntimeError):
    """A step failed; the message names it and the fix."""


def chart_version() -> str:
    found = re.search(r"^version:\s*(\S+)", (CHART / "Chart.yaml").read_text(), re.M)
    if found is None:
        raise ReleaseError(f"no version in {CHART / 'Chart.yaml'}")
    return found.group(1).strip("\"'")


def push_image(registry: str, ca: Path | None) -> str:
    podman = Podman()
    built = trainer_image(podman)
    remote = f"{registry}/ddp-trainer:{built.version}"
    args = ["push"]
    with tempfile.TemporaryDirectory() as certs:
        if ca is not None:  # podman's --cert-dir takes the CA as *.crt
            shutil.copy2(ca, Path(certs) / "ca.crt")
            args += ["--cert-dir", certs]
        try:
            podman.run(*args, built.ref, f"docker://{remote}", timeout=1200)
        except PodmanError as err:
            raise ReleaseError(f"podman push to {remote} failed: {str(err).splitlines()[-1]} "
                               "(fix: check REGISTRY and, for a private CA, REGISTRY_CA)") from err
    return remote


def push_chart(registry: str, ca: Path | None) -> str:
    with tempfile.TemporaryDirectory() as out:
        helm("package", str(CHART), "--destination", out)
        (package,) = Path(out).glob("ddp-trainer-*.tgz")
        args = ["push", str(package), f"oci://{registry}/charts"]
        if ca is not None:
            args += ["--ca-file", str(ca)]
        helm(*args)
    return f"oci://{registry}/charts/ddp-trainer"


def helm(*args: str) -> None:
    if not HELM.exists():
        raise ReleaseError(f"{HELM} is missing (fix: make tools)")
    proc = subprocess.run([str(HELM), *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        last = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-1:]
        raise ReleaseError(f"helm {args[0]} failed: {' '.join(last)} (fix: check REGISTRY and, "
                           "for a private CA, REGISTRY_CA)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("registry", help="host:port of the OCI registry")
    parser.add_argument("--ca", type=Path, help="the registry's CA certificate (PEM)")
    args = parser.parse_args(argv)
    try:
        if args.ca is not None and not args.ca.is_file():
            raise ReleaseError(f"REGISTRY_CA {args.ca} is not a file (fix: the registry's CA "
                               "certificate in PEM, or leave REGISTRY_CA unset)")
        image = push_image(args.registry, args.ca)
        chart = push_chart(args.registry, args.ca)
    except ReleaseError as err:
        print(f"release: error: {err}", file=sys.stderr)
        return 2
    repository = image.rsplit(":", 1)[0]
    print(f"release: image {image}\nrelease: chart {chart} {chart_version()}\n"
          f"install: helm install NAME {chart} --version {chart_version()} "
          f"--set image.repository={repository}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
