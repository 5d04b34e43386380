"""A real S3 server for tests: SeaweedFS's `weed server -s3` (master, volume, filer and the S3
gateway in one process) on free localhost ports, with its own data folder and one S3 identity.

Usage::

    with SeaweedS3(tmp_path) as s3:          # started, the bucket created
        env = s3.env                         # AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...
        url = s3.url("ckpt")                 # s3://<bucket>/ckpt

The binary is built from tools/s3server/go.mod (tools/s3server.py) on first use, once per
machine; a build that fails raises :class:`S3ServerUnavailable` with the build's error, so a
test fails with it instead of skipping.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = ["S3ServerUnavailable", "SeaweedS3"]

ACCESS_KEY = "ddptrainertest"
SECRET_KEY = "ddptrainertest-secret-0123456789"
BUCKET = "ddp-trainer-test"
REGION = "us-east-1"


class S3ServerUnavailable(RuntimeError):
    """`weed` could not be built or did not start serving S3."""


def _free_ports(n: int) -> list[int]:
    """`n` distinct free ports (held open together, so none is handed out twice)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def weed_binary() -> Path:
    from tools.s3server import BuildError, weed

    try:
        return weed()
    except BuildError as exc:
        raise S3ServerUnavailable(f"SeaweedFS (tools/s3server/go.mod) did not build: {exc}") \
            from None


class SeaweedS3:
    def __init__(self, workdir: Path, bucket: str = BUCKET, start_timeout: float = 120) -> None:
        self.workdir, self.bucket, self.start_timeout = workdir, bucket, start_timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self._command: list[str] = []
        self.port = 0
        self.log = workdir / "weed.log"

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        """The standard AWS variables that point a client at this server."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_DEFAULT_REGION": REGION,
                "AWS_EC2_METADATA_DISABLED": "true"}

    def url(self, prefix: str) -> str:
        return f"s3://{self.bucket}/{prefix.strip('/')}"

    def filesystem(self) -> Any:
        """An s3fs filesystem on this server (a fresh one: no listing cache)."""
        import s3fs

        return s3fs.S3FileSystem(key=ACCESS_KEY, secret=SECRET_KEY, endpoint_url=self.endpoint,
                                 client_kwargs={"region_name": REGION},
                                 skip_instance_cache=True, use_listings_cache=False)

    def start(self) -> SeaweedS3:
        binary = weed_binary()
        data = self.workdir / "weed-data"
        data.mkdir(parents=True, exist_ok=True)
        identities = self.workdir / "s3-identities.json"
        identities.write_text(json.dumps({"identities": [{
            "name": "test", "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
            "actions": ["Admin", "Read", "List", "Tagging", "Write"]}]}))
        (master, master_grpc, volume, volume_grpc, filer, filer_grpc, s3,
         s3_grpc) = _free_ports(8)
        self.port = s3
        command = [str(binary), "server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                   f"-dir={data}", "-volume.max=0", "-master.volumeSizeLimitMB=64",
                   f"-master.port={master}", f"-master.port.grpc={master_grpc}",
                   f"-volume.port={volume}", f"-volume.port.grpc={volume_grpc}",
                   "-volume.preStopSeconds=0", "-filer", f"-filer.port={filer}",
                   f"-filer.port.grpc={filer_grpc}", "-s3", f"-s3.port={s3}",
                   f"-s3.port.grpc={s3_grpc}", f"-s3.config={identities}",
                   "-s3.port.iceberg=0", "-s3.port.lance=0"]
        self._command = command
        self.proc = subprocess.Popen(command, stdout=self.log.open("wb"),
                                     stderr=subprocess.STDOUT, cwd=self.workdir)
        self._wait_until_bucket_made()
        return self

    def kill(self) -> None:
        """Stop the server at once (SIGKILL), as a crashed store: its port refuses connections
        from now on; its data stays for :meth:`restart`."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def restart(self) -> SeaweedS3:
        """Serve again on the same ports, from the same data (after :meth:`kill`)."""
        self.proc = subprocess.Popen(self._command, stdout=self.log.open("ab"),
                                     stderr=subprocess.STDOUT, cwd=self.workdir)
        self._wait_until_bucket_made()
        return self

    def _wait_until_bucket_made(self) -> None:
        """Until the gateway answers AND its filer takes a bucket: the S3 port opens before
        the master has a volume server to write to."""
        fs = self.filesystem()
        deadline = time.monotonic() + self.start_timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise S3ServerUnavailable(f"weed exited with {self.proc.returncode}: "
                                          f"{self.log.read_text()[-3000:]}")
            try:
                fs.makedirs(self.bucket, exist_ok=True)
                fs.pipe_file(f"{self.bucket}/.ready", b"ok")
                if fs.cat_file(f"{self.bucket}/.ready") == b"ok":
                    fs.rm_file(f"{self.bucket}/.ready")
                    return
            except Exception as exc:  # noqa: BLE001 - not serving yet: any error, retried
                last = exc
            time.sleep(0.5)
        self.stop()
        raise S3ServerUnavailable(f"weed did not serve S3 on {self.endpoint} within "
                                  f"{self.start_timeout:g} s (last error: {last!r}): "
                                  f"{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        """Kill the server: its data goes with its work folder, and weed's graceful shutdown
        on SIGTERM took 15 s, paid at every test's teardown."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def __enter__(self) -> SeaweedS3:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
