# syntax=docker/dockerfile:1.7
# ddp-trainer image. Build with `make image` (tags ghcr.io/ddp-trainer/ddp-trainer:<version>).
#
#   GPU (default): official PyTorch CUDA runtime base, torch as shipped in it.
#   CPU:           docker build --build-arg VARIANT=cpu .   (python slim + torch CPU wheel)
#
# The final stage has no compilers, no pip cache and no build files; it runs as UID/GID 10001
# (the chart's securityContext) and works with a read-only root filesystem: it writes only to
# /tmp (emptyDir; HOME and every cache live there), /outputs and /checkpoints.

# Build args a user may need besides VARIANT (corporate mirrors, air-gapped clusters): the base
# images and the package indexes. The defaults are the pinned public ones; tests/image checks
# that each default has a fixed version tag. `make e2e` builds with a locally made Debian base
# and a local wheel index (docs/e2e.md).
#   PYTHON_IMAGE    base of the wheel stage and of the CPU variant: a Python with pip on PATH
#   PYTORCH_IMAGE   base of the GPU variant: torch and CUDA installed
#   PIP_INDEX_URL   index of every pip install except the CPU variant's torch
#   TORCH_INDEX_URL index of the CPU variant's torch (and its dependencies)
ARG VARIANT=gpu
ARG PYTHON_IMAGE=python:3.12-slim-bookworm
ARG PYTORCH_IMAGE=pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime

# --- wheel: build the project wheel (tests/image/test_wheel.py runs this same command) -------
FROM ${PYTHON_IMAGE} AS wheel
ARG VERSION=""
# pip reads PIP_INDEX_URL from the environment, which a build arg is during RUN.
ARG PIP_INDEX_URL=https://pypi.org/simple
WORKDIR /src
RUN python -m pip install --no-cache-dir setuptools==84.2.1 wheel==0.48.0
COPY pyproject.toml README.md ./
COPY trainer ./trainer
RUN python -m pip wheel --no-deps --no-build-isolation --wheel-dir /dist . \
    && if [ -n "${VERSION}" ]; then test -f "/dist/ddp_trainer-${VERSION}-py3-none-any.whl"; fi

# --- runtime bases -----------------------------------------------------------------------------
FROM ${PYTORCH_IMAGE} AS base-gpu

FROM ${PYTHON_IMAGE} AS base-cpu
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
RUN python -m pip install --no-cache-dir --index-url "${TORCH_INDEX_URL}" \
        "torch==${TORCH_VERSION}"

# --- final image -------------------------------------------------------------------------------
# DL3006: "base-gpu"/"base-cpu" are stages of this file (pinned above), not registry images;
# hadolint cannot resolve a stage name built from an ARG.
# checkov reads base-${VARIANT} and the ${...} bases as untagged images, and its skip covers every
# FROM of the file; tests/image/test_dockerfile.py checks instead that each default has a fixed tag.
# checkov:skip=CKV_DOCKER_7: base-${VARIANT} is a stage of this file; the default bases are pinned
# hadolint ignore=DL3006
FROM base-${VARIANT} AS runtime
ARG VERSION=""
ARG PIP_INDEX_URL=https://pypi.org/simple
LABEL org.opencontainers.image.title="ddp-trainer" \
      org.opencontainers.image.description="Kubernetes-native distributed PyTorch training (DDP, Prometheus metrics, Kubeflow PyTorchJob)" \
      org.opencontainers.image.source="https://github.com/ddp-trainer/ddp-trainer" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# The trainer's dependencies and theirs, pinned (the versions the test suite was run with),
# plus the parts of the `data` extra every image needs: pyarrow (CSV) and Pillow (image
# folders). Arrow `save_to_disk` directories and Parquet also need Hugging Face `datasets`:
# add it in your own image (README "Your data"). The `s3` extra (s3fs, then aiobotocore,
# botocore and aiohttp with theirs) so that checkpoint.dir and output.dir may be s3:// URLs
# (docs/checkpoints.md, the chart's storage.s3 values).
# torch is not listed: the base provides it (with its own dependencies) and `torch>=2.4` is
# already satisfied, so pip never replaces it. The wheel comes in through a bind mount, so no
# layer keeps it. PIP_BREAK_SYSTEM_PACKAGES: a base whose interpreter is marked externally
# managed (PEP 668) keeps its torch in that interpreter's site-packages, where ours must go too.
RUN --mount=type=bind,from=wheel,source=/dist,target=/wheels \
    PIP_BREAK_SYSTEM_PACKAGES=1 python -m pip install --no-cache-dir \
        /wheels/ddp_trainer-*.whl \
        numpy==2.4.6 \
        scikit-learn==1.9.1 \
        scipy==1.17.1 \
        joblib==1.6.0 \
        threadpoolctl==3.8.0 \
        narwhals==2.29.0 \
        PyYAML==6.0.4 \
        prometheus-client==0.26.0 \
        tqdm==4.70.1 \
        safetensors==0.8.0 \
        pyarrow==26.0.1 \
        pillow==13.0.0 \
        s3fs==2026.9.0 \
        fsspec==2026.9.0 \
        aiobotocore==3.10.0 \
        botocore==1.43.117 \
        aiohttp==3.14.5 \
        aiohappyeyeballs==2.7.1 \
        aiosignal==1.4.0 \
        aioitertools==0.13.0 \
        attrs==26.1.0 \
        frozenlist==1.8.0 \
        multidict==7.2.1 \
        propcache==0.5.4 \
        yarl==1.25.1 \
        idna==3.21 \
        jmespath==1.1.0 \
        python-dateutil==2.9.0.post0 \
        six==1.17.0 \
        urllib3==2.8.0 \
        wrapt==2.5.2 \
        typing-extensions==4.16.0 \
    && ddp-trainer --version

# Fixed non-root user; the directories the pod mounts exist and belong to it so the image
# also runs without volumes (e.g. `docker run`), and /etc/ddp-trainer holds the config mount.
RUN groupadd --system --gid 10001 trainer \
    && useradd --system --uid 10001 --gid 10001 --home-dir /tmp --no-create-home \
        --shell /usr/sbin/nologin trainer \
    && mkdir -p /outputs /checkpoints /data /etc/ddp-trainer \
    && chown 10001:10001 /outputs /checkpoints

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/tmp \
    TMPDIR=/tmp \
    XDG_CACHE_HOME=/tmp/.cache \
    TORCH_HOME=/tmp/.cache/torch \
    TORCHINDUCTOR_CACHE_DIR=/tmp/.cache/torchinductor \
    TRITON_CACHE_DIR=/tmp/.cache/triton \
    CUDA_CACHE_PATH=/tmp/.cache/nv \
    MPLCONFIGDIR=/tmp/.cache/matplotlib \
    SCIKIT_LEARN_DATA=/tmp/.cache/scikit_learn_data

WORKDIR /tmp
USER 10001:10001
EXPOSE 9310
# Kubernetes ignores Docker health checks; the chart defines the pod's probes.
HEALTHCHECK NONE
ENTRYPOINT ["ddp-trainer"]
CMD ["--help"]
