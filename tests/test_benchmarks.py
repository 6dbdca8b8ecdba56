"""The arithmetic behind the ratios benchmarks/build.py prints, which the README quotes."""

from __future__ import annotations

import sys

from benchmarks.build import beyond_fixed, run_measured_with_own_cpu


def _local(cpu: float, system: float, wall: float = 1.0, launcher: float = 0.0) -> tuple[float, int, float, int, float, float]:
    return wall, 0, cpu, 0, system, launcher


def _pool(launcher: float, workers: float, system: float) -> dict:
    return {"launcher_cpu": launcher, "workers_cpu": workers, "system_cpu": system}


def test_cpu_beyond_the_one_row_builds_is_split_into_user_and_system_repeat_by_repeat():
    # In process: 11 CPU-s (3 system) on every row, 1 (0.5 system) on one row: 10 beyond, 7.5 user, 2.5 system.
    in_process, in_process_one = [_local(11.0, 3.0)] * 3, [_local(1.0, 0.5)] * 3
    # Two processes: 17 CPU-s (6 system), one row 3 (1 system): 14 beyond = 1.4x, user 9 = 1.2x, system 5 = 2x.
    workers, workers_one = [_local(17.0, 6.0)] * 3, [_local(3.0, 1.0)] * 3
    line = beyond_fixed(workers, workers_one, in_process, in_process_one)
    assert line == ("CPU per row beyond each one's one-row build: all 1.40x (1.40-1.40), user 1.20x (1.20-1.20), "
                    "system 2.00x (2.00-2.00)")


def test_pool_jobs_count_the_launcher_and_the_workers_and_ranges_span_the_repeats():
    in_process, in_process_one = [_local(11.0, 3.0), _local(21.0, 5.0)], [_local(1.0, 0.5)] * 2
    pool = [_pool(2.0, 10.0, 3.0), _pool(4.0, 17.0, 4.5)]  # 12 (3 system), 21 (4.5 system)
    pool_one = [_pool(1.0, 1.0, 0.5)] * 2  # 2 (0.5 system)
    line = beyond_fixed(pool, pool_one, in_process, in_process_one)
    # Repeat 1: 10/10 = 1.00x, user 7.5/7.5, system 2.5/2.5. Repeat 2: 19/20 = 0.95x, user 15/15.5, system 4/4.5.
    assert line == ("CPU per row beyond each one's one-row build: all 0.97x (0.95-1.00), user 0.98x (0.97-1.00), "
                    "system 0.94x (0.89-1.00)")


_SPIN = """
import sys, time
end = time.process_time() + float(sys.argv[1])
spins = 0
while time.process_time() < end:  # burns CPU until the process has spent the seconds asked for
    spins += 1
"""
# Spins 0.3 CPU-s itself, then waits for a child that spins 0.8.
_SPINS_THEN_WAITS_FOR_A_SPINNING_CHILD = f"""
import subprocess, sys
SPIN = {_SPIN!r}
exec(SPIN.replace("float(sys.argv[1])", "0.3"))
subprocess.run([sys.executable, "-c", SPIN, "0.8"], check=True)
"""


def test_a_launchers_own_cpu_leaves_out_what_its_children_spent():
    _, _, cpu, _, own = run_measured_with_own_cpu([sys.executable, "-c", _SPINS_THEN_WAITS_FOR_A_SPINNING_CHILD])
    assert cpu >= 1.1  # wait4's rusage: the process and the child it waited for
    assert 0.3 <= own < 0.7  # its own spin and start-up, not the child's 0.8 s


# --- benchmarks/object_store_cost.py: how requests are classified, and one tiny run so it cannot rot ---

_BATCH_BODY = b"""--BOUNDARY\r
Content-Type: application/http\r
Content-Transfer-Encoding: binary\r
Content-ID: <a+1>\r
\r
POST http://127.0.0.1:9/storage/v1/b/bkt/o/x%2Fa/rewriteTo/b/bkt/o/y%2Fa?prettyPrint=false HTTP/1.1\r
Content-Type: application/json\r
\r
{}\r
--BOUNDARY\r
Content-Type: application/http\r
Content-ID: <a+2>\r
\r
DELETE /storage/v1/b/bkt/o/x%2Fa?prettyPrint=false HTTP/1.1\r
\r
\r
--BOUNDARY\r
Content-Type: application/http\r
Content-ID: <a+3>\r
\r
GET /storage/v1/b/bkt/o/x%2Fb?fields=name HTTP/1.1\r
\r
\r
--BOUNDARY--\r
"""


def test_a_gcs_batch_call_counts_each_of_its_sub_requests_by_kind():
    from benchmarks.object_store_cost import gcs_operations

    operations = gcs_operations("POST", "/batch/storage/v1", {"content-type": 'multipart/mixed; boundary="BOUNDARY"'},
                                _BATCH_BODY)
    assert [operation.kind for operation in operations] == ["copy", "delete", "get"]


def test_gcs_requests_are_classified_by_method_and_path():
    from benchmarks.object_store_cost import gcs_operations

    def kind(method: str, target: str) -> str:
        (operation,) = gcs_operations(method, target, {}, b"")
        return operation.kind

    assert kind("GET", "/storage/v1/b/bkt/o?prefix=ds%2F") == "list"
    assert kind("GET", "/storage/v1/b/bkt/o/ds%2Fa?fields=name") == "get"
    assert kind("GET", "/storage/v1/b/bkt/o/ds%2Fa?alt=media") == "download"
    assert kind("GET", "/download/storage/v1/b/bkt/o/ds/a?alt=media") == "download"
    assert kind("POST", "/upload/storage/v1/b/bkt/o?uploadType=resumable") == "upload"
    assert kind("DELETE", "/storage/v1/b/bkt/o/ds%2Fa") == "delete"
    assert kind("GET", "/storage/v1/b/bkt?projection=noAcl") == "other"


def test_s3_requests_are_classified_by_method_path_query_and_copy_header():
    from benchmarks.object_store_cost import s3_operations

    def kind(method: str, target: str, headers: dict | None = None, body: bytes = b"") -> tuple[str, int, bool]:
        (operation,) = s3_operations(method, target, headers or {}, body)
        return operation.kind, operation.uploaded, operation.starts_object

    assert kind("GET", "/bkt?list-type=2&prefix=ds%2F") == ("list", 0, False)
    assert kind("GET", "/bkt?location") == ("other", 0, False)
    assert kind("HEAD", "/bkt/ds/a") == ("get", 0, False)
    assert kind("GET", "/bkt/ds/a") == ("download", 0, False)
    assert kind("PUT", "/bkt/ds/a", body=b"12345") == ("upload", 5, True)
    assert kind("PUT", "/bkt/ds/a?partNumber=1&uploadId=u", body=b"123") == ("upload", 3, False)
    assert kind("POST", "/bkt/ds/a?uploads") == ("upload", 0, True)
    assert kind("PUT", "/bkt/ds/b", {"x-amz-copy-source": "bkt/ds/a"}) == ("copy", 0, False)
    assert kind("DELETE", "/bkt/ds/a") == ("delete", 0, False)
    assert kind("POST", "/bkt?delete", body=b"<Delete/>") == ("delete", 0, False)


def test_an_s3_copy_in_parts_is_counted_as_copies_and_an_upload_in_parts_as_uploads():
    from benchmarks.object_store_cost import copies_in_parts, s3_operations

    requests = [("POST", "/bkt/staged?uploads", {}), ("PUT", "/bkt/staged?partNumber=1&uploadId=u1", {}),
                ("POST", "/bkt/staged?uploadId=u1", {}),
                ("POST", "/bkt/final?uploads", {}),
                ("PUT", "/bkt/final?partNumber=1&uploadId=c1", {"x-amz-copy-source": "bkt/staged"}),
                ("PUT", "/bkt/final?partNumber=2&uploadId=c1", {"x-amz-copy-source": "bkt/staged"}),
                ("POST", "/bkt/final?uploadId=c1", {})]
    operations = copies_in_parts([op for method, target, headers in requests
                                  for op in s3_operations(method, target, headers, b"x")])
    assert [op.kind for op in operations] == ["upload"] * 3 + ["copy"] * 4
    assert sum(op.starts_object for op in operations) == 1


def test_the_object_store_cost_benchmark_runs_both_jobs_on_both_servers(tmp_path):
    from benchmarks.object_store_cost import JOBS, NUM_SHARDS, STORES, describe, run

    rows = 300
    results = run(rows, 1, ["gs", "s3"], tmp_path)  # each job's output is checked: NUM_SHARDS shards of every row
    for scheme, runs in results.items():
        ours, beams = runs[JOBS[0]][0], runs[JOBS[1]][0]
        # Beam's sink writes a temp file per shard, then renames each: a copy and a delete per shard (on GCS,
        # sub-requests of batch calls, counted one by one).
        assert beams.objects_uploaded == NUM_SHARDS and beams.kinds["copy"] == NUM_SHARDS, (scheme, beams)
        assert beams.kinds["delete"] >= (NUM_SHARDS if scheme == "gs" else 1), (scheme, beams)
        assert ours.objects_uploaded >= NUM_SHARDS and ours.kinds["list"] >= 1, (scheme, ours)
        assert 0 < beams.uploaded_bytes and 0 < ours.uploaded_bytes
        table = describe(STORES[scheme], rows, runs)
        assert table[2].startswith("| job | list | get |") and any("over Beam's job" in line for line in table)


# --- benchmarks/read_index.py: one tiny run so it cannot rot ---


def test_the_read_index_benchmark_measures_every_layout(capsys):
    from benchmarks.read_index import LAYOUTS, main

    main(["--rows", "3000", "--repeats", "1"])
    out = capsys.readouterr().out
    assert "8 shards, 3,000 records" in out
    for layout in LAYOUTS:
        assert f"| {layout} |" in out
    for use in ("split plans, local", "split plans, gs:// emulator", "seeks (middle record)", "record starts (whole)",
                "exact seeks from the record starts"):
        assert f"| {use} |" in out
