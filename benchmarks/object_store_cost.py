"""Benchmark: object-store requests of a tfrbeam build against Beam's typical job, by kind, on real storage APIs.

Run by hand from the repository root (request counts do not depend on the machine's load; the
median and range of --repeats runs are printed where they vary):

    python -m benchmarks.object_store_cost [--rows 1000000] [--repeats 3] [--stores gs,s3]

Each repeat starts a fresh server per store on 127.0.0.1 (tests/storage_servers.py:
``gcp-storage-emulator`` for ``gs://``, ``moto_server`` for ``s3://``) and, in this process, a
counting HTTP proxy in front of it; the jobs are child processes whose clients reach the server
only through the proxy (``STORAGE_EMULATOR_HOST``, ``AWS_ENDPOINT_URL`` and Beam's
``--s3_endpoint_url`` name the proxy). Into a new bucket each, on the benchmark table
(benchmarks/table.py) written as one local Parquet file:

- ours: ``python -m tfrbeam.builder`` of benchmarks.build's config (shuffled, one split, 8 shards)
  with ``output.path`` in the bucket: the whole build, lock and commit included;
- Beam's typical job: benchmarks.build's baseline (``ReadFromParquet`` -> protobuf per row ->
  ``Reshuffle`` -> ``beam.io.WriteToTFRecord(num_shards=8)``) writing into the bucket.

The proxy classifies every request by method and path, and every sub-request of a GCS batch call
(``POST /batch/storage/v1``, a multipart body) as one operation, as GCS bills them:

- GCS JSON API: ``GET .../o`` list; ``GET .../o/NAME`` get (metadata); with ``alt=media`` (or
  ``/download/``) download; ``/upload/...`` upload (a resumable upload's start and each chunk);
  ``.../rewriteTo/...`` or ``copyTo`` copy; ``DELETE`` delete.
- S3: ``GET`` of the bucket (``list-type=2``) list; ``HEAD`` get; ``GET`` of a key download;
  ``PUT`` upload, with ``x-amz-copy-source`` copy; a multipart upload's create and complete
  (``POST ?uploads``, ``POST ?uploadId``) upload; ``DELETE`` or ``POST ?delete`` delete.

Anything else is "other", and listed by shape at the end. "objects uploaded" counts the uploads
started (a resumable or multipart upload is one), "MB uploaded" the request bodies of uploads.
Both outputs are checked afterwards (directly, not through the proxy): 8 shards holding every row.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import email.message
import email.parser
import http.client
import http.server
import json
import os
import pathlib
import re
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks.build import NUM_SHARDS, build_config, compile_bytecode
from benchmarks.write_dataset import _write_table
from tests.storage_servers import GcsEmulator, MotoS3, StoreBucket, _Server

KINDS = ("list", "get", "download", "upload", "copy", "delete", "other")
_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade",
               "expect", "content-length"}
_PROXY_TIMEOUT_SECONDS = 600
_JOB_TIMEOUT_SECONDS = 3600


@dataclasses.dataclass(frozen=True)
class Operation:
    """One billable object-store operation: its kind, its shape (for "other"), the bytes it uploaded."""

    kind: str
    shape: str = ""
    uploaded: int = 0
    starts_object: bool = False
    key: str = ""  # S3 multipart uploads: the object, and the upload (see copies_in_parts)
    upload_id: str = ""


# ------------------------------------------------------------------------------ classifying requests


def _query(target: str) -> tuple[str, dict[str, list[str]]]:
    parts = urllib.parse.urlsplit(target)
    return parts.path, urllib.parse.parse_qs(parts.query, keep_blank_values=True)


def _gcs_shape(method: str, path: str) -> str:
    return method + " " + re.sub(r"/o/[^/]+", "/o/O", re.sub(r"/b/[^/]+", "/b/B", path))


def gcs_operation(method: str, target: str, body_size: int = 0) -> Operation:
    """The kind of one GCS JSON API request (not a batch call: see ``gcs_operations``)."""
    path, query = _query(target)
    if path.startswith("/upload/"):
        return Operation("upload", uploaded=body_size, starts_object=method == "POST")
    if path.startswith("/download/"):
        return Operation("download")
    if "/rewriteTo/" in path or "/copyTo/" in path:
        return Operation("copy")
    if method == "DELETE" and re.search(r"/b/[^/]+/o/.", path):
        return Operation("delete")
    if method == "GET" and re.search(r"/b/[^/]+/o$", path):
        return Operation("list")
    if method == "GET" and re.search(r"/b/[^/]+/o/.", path):
        return Operation("download" if query.get("alt") == ["media"] else "get")
    return Operation("other", shape=_gcs_shape(method, path))


def gcs_batch_lines(content_type: str, body: bytes) -> list[str]:
    """The request lines (``METHOD URL HTTP/1.1``) of the sub-requests in a GCS batch call's multipart body."""
    message = email.parser.BytesParser().parsebytes(b"Content-Type: " + content_type.encode() + b"\r\n\r\n" + body)
    lines = []
    for part in message.get_payload() if message.is_multipart() else []:
        payload = part.get_payload() if isinstance(part, email.message.Message) else part
        first = next((line for line in str(payload).splitlines() if line.strip()), "")
        lines.append(first.strip())
    return lines


def gcs_operations(method: str, target: str, headers: Mapping[str, str], body: bytes) -> list[Operation]:
    """The operations of one HTTP request to a GCS API (``headers`` by lowercase name): a batch call's sub-requests
    each, else the request."""
    if urllib.parse.urlsplit(target).path.startswith("/batch/"):
        operations = []
        for line in gcs_batch_lines(headers.get("content-type", ""), body):
            sub_method, _, rest = line.partition(" ")
            operations.append(gcs_operation(sub_method, rest.rsplit(" HTTP/", 1)[0]))
        return operations
    return [gcs_operation(method, target, len(body))]


_S3_BUCKET_SETTINGS = {"location", "versioning", "acl", "policy", "cors", "lifecycle", "tagging", "encryption",
                       "object-lock", "ownershipControls", "publicAccessBlock", "website", "logging"}


def s3_operations(method: str, target: str, headers: Mapping[str, str], body: bytes) -> list[Operation]:
    """The operation of one HTTP request to an S3 API (path-style addressing, as with an endpoint on an IP;
    ``headers`` by lowercase name)."""
    path, query = _query(target)
    bucket_and_key = path.lstrip("/").split("/", 1)
    has_key = len(bucket_and_key) == 2 and bucket_and_key[1] != ""
    shape = f"{method} {'/B/KEY' if has_key else '/B'}" + (f"?{'&'.join(sorted(query))}" if query else "")
    uploaded = int(headers.get("x-amz-decoded-content-length") or len(body))
    if not has_key:
        if method == "GET" and not _S3_BUCKET_SETTINGS & set(query):
            return [Operation("list")]
        if method == "POST" and "delete" in query:
            return [Operation("delete")]
        return [Operation("other", shape=shape)]
    if method == "HEAD":
        return [Operation("get")]
    if method == "GET" and not query.keys() - {"partNumber", "versionId"}:
        return [Operation("download")]
    key, upload_id = bucket_and_key[1], query.get("uploadId", [""])[0]
    if method == "PUT" and "x-amz-copy-source" in headers:
        return [Operation("copy", key=key, upload_id=upload_id)]
    if method == "PUT" and not query.keys() - {"partNumber", "uploadId"}:
        return [Operation("upload", uploaded=uploaded, starts_object=not upload_id, key=key, upload_id=upload_id)]
    if method == "POST" and ("uploads" in query or upload_id):
        return [Operation("upload", starts_object="uploads" in query, key=key, upload_id=upload_id)]
    if method == "DELETE" and not query:
        return [Operation("delete")]
    return [Operation("other", shape=shape)]


def copies_in_parts(operations: list[Operation]) -> list[Operation]:
    """S3 copies a large object as a multipart upload whose parts are copies (UploadPartCopy): its create and
    complete are then part of a copy, not an upload. The create names no upload id, so the first creates of each
    key copied in parts are taken for those copies (the jobs here never upload and copy to one key)."""
    copied = {(op.key, op.upload_id) for op in operations if op.kind == "copy" and op.upload_id}
    creates_left = collections.Counter(key for key, _ in copied)
    relabelled = []
    for op in operations:
        if op.kind == "upload" and (op.key, op.upload_id) in copied:
            op = dataclasses.replace(op, kind="copy")
        elif op.kind == "upload" and op.starts_object and creates_left[op.key] > 0 and not op.upload_id:
            creates_left[op.key] -= 1
            op = dataclasses.replace(op, kind="copy", starts_object=False)
        relabelled.append(op)
    return relabelled


# ------------------------------------------------------------------------------ the counting proxy


@dataclasses.dataclass(frozen=True)
class Requests:
    """What one job asked of the store: operations by kind, and the rest of what the table shows."""

    kinds: Mapping[str, int]
    uploaded_bytes: int
    objects_uploaded: int
    batch_calls: int
    others: Mapping[str, int]
    trace: tuple[str, ...] = dataclasses.field(default=(), compare=False, repr=False)

    @property
    def total(self) -> int:
        return sum(self.kinds.values())


class _Tally:
    """The proxy's running count, shared by its handler threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._operations: list[Operation] = []
        self._batch_calls = 0
        self.trace: list[str] = []  # every request line and its operations, in order: what --trace writes

    def add(self, request_line: str, operations: list[Operation], batch: bool) -> None:
        with self._lock:
            self._operations.extend(operations)
            self._batch_calls += int(batch)
            self.trace.append(request_line + "  -> " + " ".join(operation.kind for operation in operations))

    def take(self) -> Requests:
        """What was counted since the last take, and start again from zero."""
        with self._lock:
            operations, batch_calls, trace = self._operations, self._batch_calls, self.trace
            self._operations, self._batch_calls, self.trace = [], 0, []
        operations = copies_in_parts(operations)
        kinds = collections.Counter(operation.kind for operation in operations)
        return Requests(kinds={kind: kinds.get(kind, 0) for kind in KINDS},
                        uploaded_bytes=sum(operation.uploaded for operation in operations),
                        objects_uploaded=sum(operation.starts_object for operation in operations),
                        batch_calls=batch_calls,
                        others=dict(collections.Counter(op.shape for op in operations if op.kind == "other")),
                        trace=tuple(trace))


Classifier = Callable[[str, str, Mapping[str, str], bytes], list[Operation]]


def _trace_line(method: str, target: str, headers: Mapping[str, str], body: bytes) -> str:
    """The request line, with a GCS batch call's sub-requests and the name of a GCS upload (it is in the body)."""
    line = f"{method} {target}"
    if target.startswith("/batch/"):
        line += "".join("\n    " + sub for sub in gcs_batch_lines(headers.get("content-type", ""), body))
    elif method == "POST" and target.startswith("/upload/"):
        name = re.search(rb'"name"\s*:\s*"([^"]+)"', body[:4096])
        line += f" name={name.group(1).decode()}" if name else ""
    return line


class _ForwardingHandler(http.server.BaseHTTPRequestHandler):
    """Counts each request, then forwards it to the server unchanged (Host included) and relays the answer."""

    protocol_version = "HTTP/1.1"  # keep-alive, as the clients expect of a real endpoint
    server: _ProxyServer
    _upstream: http.client.HTTPConnection | None = None

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _body(self) -> bytes:
        if self.headers.get("Content-Length"):
            return self.rfile.read(int(self.headers["Content-Length"]))
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            while self.rfile.readline().strip():  # trailers
                pass
            return b"".join(chunks)
        return b""

    def _forward(self) -> None:
        body = self._body()
        headers = {name.lower(): value for name, value in self.headers.items()}
        operations = self.server.classify(self.command, self.path, headers, body)
        self.server.tally.add(_trace_line(self.command, self.path, headers, body), operations,
                              batch=self.path.startswith("/batch/"))
        try:
            status, reason, answer_headers, answer = self._ask_upstream(body)
        except OSError as error:
            status, reason, answer_headers, answer = 502, "Bad Gateway", [], str(error).encode()
        self.send_response(status, reason)
        for name, value in answer_headers:
            if name.lower() not in _HOP_BY_HOP | {"server", "date"}:
                self.send_header(name, value)
        length = {name.lower(): value for name, value in answer_headers}.get("content-length", "0")
        self.send_header("Content-Length", length if self.command == "HEAD" else str(len(answer)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(answer)

    def _ask_upstream(self, body: bytes) -> tuple[int, str, list[tuple[str, str]], bytes]:
        if self._upstream is None:
            self._upstream = http.client.HTTPConnection("127.0.0.1", self.server.upstream_port,
                                                        timeout=_PROXY_TIMEOUT_SECONDS)
        connection = self._upstream
        connection.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
        for name, value in self.headers.items():
            if name.lower() not in _HOP_BY_HOP:
                connection.putheader(name, value)
        if body or self.command in ("POST", "PUT", "PATCH"):
            connection.putheader("Content-Length", str(len(body)))
        connection.endheaders(body or None)
        response = connection.getresponse()
        answer = response.read()
        if response.will_close:
            connection.close()
            self._upstream = None
        return response.status, response.reason, response.getheaders(), answer

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = do_PATCH = _forward


class _ProxyServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, upstream_port: int, classify: Classifier) -> None:
        super().__init__(("127.0.0.1", 0), _ForwardingHandler)
        self.upstream_port = upstream_port
        self.classify = classify
        self.tally = _Tally()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client closing its kept-alive connection is how a job ends, not an error; anything else is."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class CountingProxy:
    """A counting HTTP proxy on 127.0.0.1 in front of one storage server, serving from a thread of this process."""

    def __init__(self, upstream_port: int, classify: Classifier) -> None:
        self._server = _ProxyServer(upstream_port, classify)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def take(self) -> Requests:
        return self._server.tally.take()

    def __enter__(self) -> CountingProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


# ------------------------------------------------------------------------------ the two jobs


@dataclasses.dataclass(frozen=True)
class Store:
    """One kind of object store: its server, how requests to it are classified, and what its clients need."""

    scheme: str
    label: str
    server: Callable[[], _Server]
    classify: Classifier

    def env(self, server: _Server, proxy_url: str) -> dict[str, str]:
        endpoint = "STORAGE_EMULATOR_HOST" if self.scheme == "gs" else "AWS_ENDPOINT_URL"
        return {**server.env, endpoint: proxy_url}

    def pipeline_args(self, proxy_url: str) -> list[str]:
        if self.scheme == "gs":
            return ["--no_auth"]
        return [f"--s3_endpoint_url={proxy_url}", "--s3_access_key_id=testing", "--s3_secret_access_key=testing",
                "--s3_region_name=us-east-1"]


STORES = {
    "gs": Store("gs", "gs:// (gcp-storage-emulator)", GcsEmulator, gcs_operations),
    "s3": Store("s3", "s3:// (moto_server)", MotoS3, s3_operations),
}
JOBS = ("tfrbeam build", "Beam WriteToTFRecord")


def _run_job(command: list[str], env: Mapping[str, str], label: str) -> None:
    done = subprocess.run(command, env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=_JOB_TIMEOUT_SECONDS)
    if done.returncode != 0:
        raise SystemExit(f"{label} failed (exit {done.returncode}):\n{done.stderr[-4000:]}")


def _ours(store: Store, table: pathlib.Path, bucket: StoreBucket, work: pathlib.Path, proxy: CountingProxy) -> str:
    config = build_config("parquet", table, work / "unused")
    config["output"]["path"] = bucket.url("ours")
    config_path = work / f"ours-{bucket.name}.json"  # JSON is YAML
    config_path.write_text(json.dumps(config))
    _run_job([sys.executable, "-m", "tfrbeam.builder", str(config_path), "--quiet", *store.pipeline_args(proxy.url)],
             store.env(bucket.server, proxy.url), "tfrbeam build")
    return "ours"


def _beams(store: Store, table: pathlib.Path, bucket: StoreBucket, work: pathlib.Path, proxy: CountingProxy) -> str:
    runner_args = ["--runner=FnApiRunner", *store.pipeline_args(proxy.url)]
    _run_job([sys.executable, __file__, "--beam-job", str(table), bucket.url("beam/part"), json.dumps(runner_args)],
             store.env(bucket.server, proxy.url), "Beam's WriteToTFRecord job")
    return "beam/part"


def _count_records(data: bytes) -> int:
    """Records in one uncompressed TFRecord file, by walking its length headers."""
    count = position = 0
    while position < len(data):
        (length,) = struct.unpack_from("<Q", data, position)
        position += 12 + length + 4
        count += 1
    if position != len(data):
        raise SystemExit(f"a shard's last record runs past its end ({position} > {len(data)} bytes)")
    return count


def _shard_keys(bucket: StoreBucket, written: str) -> list[str]:
    if written == "ours":
        manifest = json.loads(bucket.get("ours/tfrbeam_dataset.json"))
        return [f"ours/{shard['path']}" for split in manifest["splits"].values() for shard in split["shards"]]
    return [f"{written}-{index:05d}-of-{NUM_SHARDS:05d}" for index in range(NUM_SHARDS)]


def check_output(bucket: StoreBucket, written: str, rows: int, label: str) -> None:
    """The job left ``NUM_SHARDS`` shards holding every row (read from the server directly, not counted)."""
    keys = _shard_keys(bucket, written)
    records = sum(_count_records(bucket.get(key)) for key in keys)
    if len(keys) != NUM_SHARDS or records != rows:
        raise SystemExit(f"{label} wrote {len(keys)} shards of {records:,} records; expected {NUM_SHARDS} of {rows:,}")


def measure_store(store: Store, table: pathlib.Path, rows: int, work: pathlib.Path,
                  trace_dir: pathlib.Path | None = None) -> dict[str, Requests]:
    """One repeat on one store: a fresh server and proxy, each job into a bucket of its own, their requests.

    ``trace_dir``: also write each job's requests in order there, one line each (``--trace``).
    """
    counted = {}
    with store.server() as server, CountingProxy(server.port, store.classify) as proxy:
        for label, job in zip(JOBS, (_ours, _beams)):
            bucket = StoreBucket(server)
            proxy.take()
            written = job(store, table, bucket, work, proxy)
            counted[label] = proxy.take()
            check_output(bucket, written, rows, label)
            if trace_dir is not None:
                name = f"{store.scheme}-{bucket.name}-{label.split()[0].lower()}.txt"
                (trace_dir / name).write_text("\n".join(counted[label].trace) + "\n")
    return counted


# ------------------------------------------------------------------------------ the report


def spread(values: list[float], digits: int = 0) -> str:
    """``12`` when every repeat gave the same, else ``12 (11-13)``: median (range)."""
    def show(value: float) -> str:
        return f"{value:,.{digits}f}"

    if show(min(values)) == show(max(values)):
        return show(statistics.median(values))
    return f"{show(statistics.median(values))} ({show(min(values))}-{show(max(values))})"


_COLUMNS = (*KINDS, "total", "per shard", "objects uploaded", "MB uploaded", "batch calls")


def _cells(runs: list[Requests]) -> list[str]:
    cells = [spread([run.kinds[kind] for run in runs]) for kind in KINDS]
    cells.append(spread([run.total for run in runs]))
    cells.append(spread([run.total / NUM_SHARDS for run in runs], 2))
    cells.append(spread([run.objects_uploaded for run in runs]))
    cells.append(spread([run.uploaded_bytes / 1e6 for run in runs], 1))
    cells.append(spread([run.batch_calls for run in runs]))
    return cells


def describe(store: Store, rows: int, runs: Mapping[str, list[Requests]]) -> list[str]:
    """The store's table (Markdown), the per-shard ratio, where ours differs by kind, and the "other" shapes."""
    repeats = len(runs[JOBS[0]])
    lines = [f"{store.label}: {rows:,} rows, {NUM_SHARDS} shards; median (range) of {repeats} repeat(s) where they vary",
             "", "| job | " + " | ".join(_COLUMNS) + " |", "|---" * (len(_COLUMNS) + 1) + "|"]
    lines += [f"| {label} | " + " | ".join(_cells(runs[label])) + " |" for label in JOBS]
    ours, beams = runs[JOBS[0]], runs[JOBS[1]]
    ratio = statistics.median(mine.total / theirs.total for mine, theirs in zip(ours, beams))
    lines.append("")
    lines.append(f"requests per shard, tfrbeam over Beam's job: {ratio:.2f}x (goal: at most 1.00x)")
    differences = {kind: statistics.median(run.kinds[kind] for run in ours)
                   - statistics.median(run.kinds[kind] for run in beams) for kind in KINDS}
    lines.append("tfrbeam minus Beam's job, by kind (medians): "
                 + ", ".join(f"{kind} {value:+g}" for kind, value in differences.items() if value))
    for label in JOBS:
        others = collections.Counter[str]()
        for run in runs[label]:
            others.update(run.others)
        if others:
            lines.append(f"other requests of {label} (all repeats): "
                         + ", ".join(f"{shape} x{count}" for shape, count in others.most_common()))
    return lines


def run(rows: int, repeats: int, stores: list[str], work: pathlib.Path,
        trace_dir: pathlib.Path | None = None) -> dict[str, dict[str, list[Requests]]]:
    """Every repeat on every store asked for; the requests of each job, repeat by repeat."""
    table = work / "table.parquet"
    # In a child process, so this process (the proxy) does not hold the table.
    subprocess.run([sys.executable, __file__, "--table", str(rows), str(table)], check=True)
    results: dict[str, dict[str, list[Requests]]] = {scheme: {label: [] for label in JOBS} for scheme in stores}
    for _ in range(repeats):
        for scheme in stores:
            for label, requests in measure_store(STORES[scheme], table, rows, work, trace_dir).items():
                results[scheme][label].append(requests)
    return results


def _beam_job(table: str, prefix: str, runner_args: str) -> None:
    from benchmarks.build import baseline_job

    baseline_job("parquet", table, prefix, runner_args=json.loads(runner_args))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--stores", default="gs,s3", help="comma-separated: gs, s3")
    parser.add_argument("--work-dir", default=None, help="keep the input and configs here (default: a temp dir)")
    parser.add_argument("--trace", default=None, metavar="DIR",
                        help="also write every job's requests, in order, one file per job and repeat, into DIR")
    parser.add_argument("--table", nargs=2, metavar=("ROWS", "PATH"), help=argparse.SUPPRESS)
    parser.add_argument("--beam-job", nargs=3, metavar=("TABLE", "PREFIX", "ARGS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.table:
        _write_table(int(args.table[0]), pathlib.Path(args.table[1]))
        return
    if args.beam_job:
        _beam_job(*args.beam_job)
        return
    stores = [scheme for scheme in args.stores.split(",") if scheme]
    unknown = set(stores) - set(STORES)
    if unknown:
        parser.error(f"unknown store(s) {sorted(unknown)}; choose from {sorted(STORES)}")
    work = pathlib.Path(args.work_dir or tempfile.mkdtemp(prefix="tfrbeam-bench-store-cost-"))
    work.mkdir(parents=True, exist_ok=True)
    compile_bytecode()
    try:
        trace_dir = pathlib.Path(args.trace) if args.trace else None
        if trace_dir is not None:
            trace_dir.mkdir(parents=True, exist_ok=True)
        results = run(args.rows, args.repeats, stores, work, trace_dir)
    finally:
        if not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)
    for scheme in stores:
        print("\n".join(describe(STORES[scheme], args.rows, results[scheme])), end="\n\n", flush=True)


if __name__ == "__main__":
    main()
