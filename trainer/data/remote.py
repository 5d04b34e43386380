"""``data.dataset`` in S3 (``s3://bucket/key`` or ``s3://bucket/prefix``), copied into a local
cache and read from there as a local path (:mod:`trainer.data.layout`): an ``.npy``/``.npz``/
Parquet/CSV file, or a folder (Parquet or CSV files, an image folder).

One copy per machine, not per rank and not through rank 0: the launcher checks the dataset
before it starts any rank (:func:`trainer.data.source.resolve`), so it downloads first, and
the ranks it starts find the copy complete. Where the ranks start without it (under an
operator each pod is a launcher; ``ddp-trainer train`` alone) the first process of a machine
downloads under a lock and the others wait on that lock. Ranks on other machines share no
filesystem with it, and sending the bytes through the process group would make every
dataset's size a collective's: each machine fetches its own copy. A copy is reused while the
store lists the same objects (names, sizes, ETags); a changed dataset is fetched again whole.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainer.components import storage
from trainer.errors import DataError

_MANIFEST = ".ddp-trainer-objects.json"


def cache_root(cache_dir: str) -> Path:
    """`data.cache_dir`/s3, or (empty) ``ddp-trainer-data`` in the temporary directory, which
    a pod has writable (the chart's ``/tmp`` emptyDir): set `data.cache_dir` on a volume to
    keep copies across pod restarts."""
    return Path(cache_dir) / "s3" if cache_dir else \
        Path(tempfile.gettempdir()) / "ddp-trainer-data"


def _listing(remote: storage.Store) -> tuple[dict[str, list[Any]], bool]:
    """{relative name: [size, etag]} of the objects at the URL, and whether it names one object
    (a file) rather than a prefix (a folder)."""
    def find() -> dict[str, dict[str, Any]]:
        found: dict[str, dict[str, Any]] = remote.fs.find(remote.root, detail=True)
        return found

    try:
        found = remote._call("listing", find)
    except FileNotFoundError:
        found = {}
    root = remote.root
    objects = {str(path): info for path, info in found.items() if info.get("type") != "directory"}
    if list(objects) == [root]:
        info = objects[root]
        return {root.rsplit("/", 1)[-1]: [info.get("size"), info.get("ETag")]}, True
    listing = {str(path)[len(root) + 1:]: [info.get("size"), info.get("ETag")]
               for path, info in objects.items() if str(path).startswith(root + "/")}
    return listing, False


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # the other local processes wait for the copy
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def local_copy(url: str, cache_dir: str = "") -> Path:
    """The local path of the dataset at `url` (a file or a folder), fetched when the cache has
    no copy of what the store lists now."""
    remote = storage.store(url, "data.dataset")
    listing, single = _listing(remote)
    if not listing:
        raise DataError(f"data.dataset {url}: no such object or prefix in the store",
                        f"check the name (aws s3 ls {url.rstrip('/')}/) or upload the data")
    key = hashlib.sha256(url.rstrip("/").encode()).hexdigest()[:16]
    root = cache_root(cache_dir)
    home = root / key
    with _locked(root / f"{key}.lock"):
        manifest = home / _MANIFEST
        with contextlib.suppress(OSError, ValueError):
            if json.loads(manifest.read_text()) == listing:
                return _entry(home, listing, single)
        staging = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=root))
        try:
            for name in sorted(listing):
                target = staging / name
                target.parent.mkdir(parents=True, exist_ok=True)
                source = remote.root if single else f"{remote.root}/{name}"
                remote._call(f"reading {name}",
                             functools.partial(remote.fs.get_file, source, str(target)))
            (staging / _MANIFEST).write_text(json.dumps(listing))
            shutil.rmtree(home, ignore_errors=True)
            os.replace(staging, home)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return _entry(home, listing, single)


def _entry(home: Path, listing: dict[str, list[Any]], single: bool) -> Path:
    return home / next(iter(listing)) if single else home
