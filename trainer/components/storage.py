"""``checkpoint.dir`` and ``output.dir`` in S3 or an S3-compatible store (``s3://bucket/prefix``).

Every file a run writes goes first to a local staging folder of the process (what the code for
local directories writes, unchanged), then into the store:

* a checkpoint as ONE object under its final name, once written and checksummed locally
  (``put_object``, or a multipart upload completed at once above 100 MiB: either way the object
  is visible only when complete, so no torn checkpoint is ever listed); older ones beyond
  ``checkpoint.keep`` are deleted from the store after it, invalid ones moved into
  ``corrupt/``;
* a resume downloads the newest checkpoint that verifies into the staging folder;
* the output files (``summary.json``, ``eval.json``, ``steps.jsonl``, ``model/``) when the rank
  leaves, finished or stopped; ``steps.jsonl`` is downloaded first, so a resumed run appends.

Credentials and the endpoint come from the standard AWS variables (``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_ENDPOINT_URL`` for an S3-compatible store, ...), read by
botocore.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainer.components.retry import DEFAULT, Backoff, retried
from trainer.errors import ConfigError, StorageError, first_line

log = logging.getLogger(__name__)

SCHEME = "s3://"
_CKPT = re.compile(r"^ckpt-(\d{9})\.pt$")
_FIX = ("check AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY and that the bucket "
        "exists")


def is_remote(spec: str | os.PathLike[str] | None) -> bool:
    return spec is not None and str(spec).startswith(SCHEME)


class Store:
    """One ``s3://bucket/prefix``: objects by name below the prefix; every failure is one
    :class:`StorageError` line naming the URL and the operation. `client`: s3fs's own
    arguments (``key``, ``secret``, ``endpoint_url``, ...) where the AWS variables of this
    process are not the ones to use (`jobs fetch` with a job's credentials)."""

    def __init__(self, url: str, what: str, **client: Any) -> None:
        root = url[len(SCHEME):].strip("/")
        if not root or root.startswith("/"):
            raise ConfigError(f"{what}: {url} names no bucket", "use s3://BUCKET[/PREFIX]")
        self.url, self.what, self.root = url.rstrip("/"), what, root
        try:
            import s3fs  # noqa: PLC0415 - the optional extra, only for s3:// directories
        except ImportError:
            raise ConfigError(f"{what}: {url} needs s3fs, which is not installed",
                              "pip install 'ddp-trainer[s3]'") from None
        for name in ("botocore", "aiobotocore", "s3fs"):  # their INFO lines say nothing new
            if logging.getLogger(name).level == logging.NOTSET:
                logging.getLogger(name).setLevel(logging.WARNING)
        # A short connect timeout and few retries: an unreachable endpoint is one line within
        # seconds, not a minute of botocore's and s3fs's retries stacked; a read timeout, so
        # that a store that accepts and never answers (stopped, overloaded) ends a try too
        # (trainer.components.retry tries again).
        self.fs = s3fs.S3FileSystem(**client, skip_instance_cache=True, use_listings_cache=False,
                                    config_kwargs={"connect_timeout": 5, "read_timeout": 30,
                                                   "retries": {"max_attempts": 2}})
        self.fs.retries = 2

    def _call(self, doing: str, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except FileNotFoundError:
            raise
        except Exception as exc:  # noqa: BLE001 - botocore, aiohttp and s3fs raise many types
            raise StorageError(f"{self.what} {self.url}: {doing} failed "
                               f"({type(exc).__name__}: {first_line(exc, 200)})", _FIX) from None

    def names(self) -> list[str]:
        try:
            found = self._call("listing", lambda: self.fs.ls(self.root, detail=False))
        except FileNotFoundError:
            return []
        return [str(p).rsplit("/", 1)[-1] for p in found]

    def get(self, name: str) -> bytes | None:
        try:
            data: bytes = self._call(f"reading {name}",
                                     lambda: self.fs.cat_file(f"{self.root}/{name}"))
        except FileNotFoundError:
            return None
        return data

    def put(self, name: str, data: bytes) -> None:
        try:
            self._call(f"writing {name}", lambda: self.fs.pipe_file(f"{self.root}/{name}", data))
        except FileNotFoundError:
            raise StorageError(f"{self.what} {self.url}: the bucket does not exist",
                               "create it (aws s3 mb s3://BUCKET) or name another") from None

    def delete(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._call(f"deleting {name}", lambda: self.fs.rm_file(f"{self.root}/{name}"))

    def probe(self) -> None:
        """Fail now, before training, when the store cannot be written."""
        name = f".probe-{uuid.uuid4().hex}"
        self.put(name, b"")
        self.delete(name)


@functools.cache
def store(url: str, what: str) -> Store:
    return Store(url, what)


@functools.cache
def _staging(spec: str) -> Path:
    return Path(tempfile.mkdtemp(prefix="ddp-trainer-s3-"))


def local_dir(spec: str) -> Path:
    """Where the code for local directories reads and writes `spec`: the path itself, or for
    an ``s3://`` URL this process's staging folder for it."""
    if not is_remote(spec):
        return Path(spec)
    path = _staging(spec)
    path.mkdir(parents=True, exist_ok=True)  # again after drop_staging (a second fit())
    return path


def refuse(value: str, flag: str) -> None:
    """One line for an ``s3://`` path where only local ones are read or written."""
    if is_remote(value):
        raise ConfigError(f"{flag} {value}: s3:// is supported only by checkpoint.dir, "
                          "output.dir and data.dataset", f"copy it to a local path first (aws "
                          f"s3 cp --recursive {value} DIR) and pass that")


def shown(spec: str, path: Path) -> str:
    """`path`, written into `spec`'s local directory, as the user named it: for an ``s3://``
    dir its URL (where it is uploaded), not the staging folder."""
    if not is_remote(spec):
        return str(path)
    return f"{spec.rstrip('/')}/{path.relative_to(local_dir(spec)).as_posix()}"


def drop_staging(spec: str) -> None:
    if is_remote(spec):
        shutil.rmtree(local_dir(spec), ignore_errors=True)


def check(spec: str, what: str) -> None:
    """Probe an ``s3://`` directory (reachable, credentials, bucket, writable); nothing for a
    local one (its own checks apply)."""
    if is_remote(spec):
        store(spec, what).probe()


# -- outputs --------------------------------------------------------------------------------

_STEPS = re.compile(r"^steps(\.\d+)?\.jsonl$")


def pull_outputs(spec: str) -> None:
    """Download the step logs of earlier runs, so that a resumed run appends to them."""
    remote = store(spec, "output.dir")
    for name in remote.names():
        if _STEPS.match(name) and (data := remote.get(name)) is not None:
            (local_dir(spec) / name).write_bytes(data)


def push_outputs(spec: str, backoff: Backoff = DEFAULT) -> None:
    """Upload what the run wrote into the staging folder (each file one object, each retried
    as `backoff` allows)."""
    remote, base = store(spec, "output.dir"), local_dir(spec)
    for path in sorted(base.rglob("*")):
        rel = path.relative_to(base).as_posix()
        if path.is_file() and not any(p.startswith(".") for p in rel.split("/")):
            data = path.read_bytes()
            retried(functools.partial(remote.put, rel, data), backoff, f"uploading {rel}")


# -- checkpoints ----------------------------------------------------------------------------

_valid: set[str] = set()
"""Checkpoint objects this process uploaded or verified: rotation downloads one only once."""


def checkpoint_names(remote: Store) -> list[str]:
    return sorted((n for n in remote.names() if _CKPT.match(n)), reverse=True)


def _set_aside(remote: Store, name: str, data: bytes, problem: str) -> None:
    remote.put(f"corrupt/{name}", data)
    remote.delete(name)
    log.warning("moved bad checkpoint %s aside to %s/corrupt/%s: %s", name, remote.url, name,
                problem)


def pull_latest(spec: str, verify: Callable[[bytes, str], str | None]) -> None:
    """Download the newest checkpoint that verifies into the staging folder; newer invalid
    ones are moved aside into ``corrupt/`` in the store."""
    remote = store(spec, "checkpoint dir")
    for name in checkpoint_names(remote):
        data = remote.get(name)
        if data is None:
            continue
        problem = verify(data, f"{remote.url}/{name}")
        if problem is not None:
            _set_aside(remote, name, data, problem)
            continue
        path = local_dir(spec) / name
        path.with_name(f".{name}.part").write_bytes(data)
        os.replace(path.with_name(f".{name}.part"), path)
        _valid.add(name)
        return


def push_checkpoint(spec: str, path: Path, keep: int,
                    verify: Callable[[bytes, str], str | None],
                    backoff: Backoff = DEFAULT) -> None:
    """Upload a checkpoint written locally (retried as `backoff` allows), then keep the
    newest `keep` valid ones in the store (the one uploaded always stays): nothing is deleted
    before the new one is durable."""
    remote = store(spec, "checkpoint dir")
    data = path.read_bytes()
    retried(functools.partial(remote.put, path.name, data), backoff, f"uploading {path.name}")
    _valid.add(path.name)
    try:
        _prune(remote, path.name, keep, verify)
    except StorageError as exc:  # the new one is durable: the old ones go at the next save
        log.warning("older checkpoints beyond checkpoint.keep not deleted now: %s", exc.problem)


def _prune(remote: Store, newest: str, keep: int,
           verify: Callable[[bytes, str], str | None]) -> None:
    kept = 0
    for name in checkpoint_names(remote):
        if name == newest:
            kept += 1
        elif kept >= keep:
            remote.delete(name)
            _valid.discard(name)
        elif name in _valid:
            kept += 1
        elif (data := remote.get(name)) is not None:
            if (problem := verify(data, f"{remote.url}/{name}")) is None:
                _valid.add(name)
                kept += 1
            else:
                _set_aside(remote, name, data, problem)


def count_start(spec: str, rank: int) -> int:
    """As :func:`trainer.components.restarts.count_start`, with the count in the store."""
    remote = store(spec, "checkpoint dir")
    name = f".starts-rank-{rank:05d}"
    try:
        previous = int((remote.get(name) or b"0").decode().strip() or 0)
    except ValueError:
        previous = 0
    remote.put(name, f"{previous + 1}\n".encode())
    return previous + 1
