"""``kill -9`` at random moments of builds into the GCS emulator (issue 41, item 4), and what made that testable: a
fresh process under ``STORAGE_EMULATOR_HOST`` reaches the store at once instead of after Beam's credential retries.

(The same sweep into S3: tests/builder/test_object_store_commit.py.)
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

from tests.builder.test_object_store_commit import _KILLED_BUILD, _check_complete, _table, _write

_FIRST_REQUEST = """
import sys, time
from tfrbeam.beam import filesystem as fs
fs.use_pipeline_options(None)
started = time.monotonic()
assert fs.exists(sys.argv[1]) is False
print(time.monotonic() - started)
"""


def _without_google_credentials(bucket) -> dict[str, str]:
    env = {**os.environ, **bucket.env}
    env.pop("GOOGLE_APPLICATION_CREDENTIALS", None)
    return env


def test_a_fresh_process_reaches_the_gcs_emulator_at_once(gcs_bucket):
    """Beam's GCS IO ignores --no_auth and asked google.auth five times with backoff (20-30 s) in every new process
    before it connected anonymously; under STORAGE_EMULATOR_HOST, with no credentials, the first request now goes out
    at once."""
    done = subprocess.run([sys.executable, "-c", _FIRST_REQUEST, gcs_bucket.url("nothing/here")],
                          env=_without_google_credentials(gcs_bucket), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert float(done.stdout.strip().splitlines()[-1]) < 8.0, done.stdout


def test_kill_9_at_random_moments_of_builds_into_gcs_leaves_the_old_or_the_new_dataset(gcs_bucket):
    """At least 20 builds into the GCS emulator killed (SIGKILL) at random moments, spread over a whole build's time:
    after each a reader finds the old dataset or the new one, whole (every listed shard with its bytes and index);
    no run is refused by a dead run's lock; the objects outside the output prefix are unchanged by hash; and the next
    build publishes and leaves nothing of the dead runs behind."""
    bucket = gcs_bucket
    output = bucket.url("killed")
    _write(bucket, "killed", _table(30))
    bucket.put("killed/train/NOTES.md", b"kept through every kill")
    bucket.put("beside/data.bin", b"\x01 not the build's")
    outside = {key: digest for key, digest in bucket.listing().items() if not key.startswith(("killed/", ".killed."))}
    env = _without_google_credentials(bucket)

    def start(seed: int) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", _KILLED_BUILD, output, str(seed), *bucket.pipeline_args()],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    started = time.monotonic()
    whole = start(1000)
    assert whole.wait(120) == 0, whole.stderr.read().decode()[-2000:] if whole.stderr else ""
    build_seconds = time.monotonic() - started
    rng = random.Random(41)
    kills, attempt = 0, 0
    while kills < 20:
        attempt += 1
        assert attempt <= 40, f"only {kills} of {attempt - 1} builds were still running when their kill came"
        process = start(attempt)
        try:
            process.wait(rng.uniform(0.3, build_seconds * 1.1))
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGKILL)
            process.wait()
            kills += 1
        stderr = process.stderr.read().decode() if process.stderr else ""
        assert "in use by" not in stderr, f"attempt {attempt} was refused by a dead run's lock: {stderr[-500:]}"
        assert _check_complete(bucket, "killed") in (30, 3000), f"after attempt {attempt} a reader found no dataset"
        now = bucket.listing()
        assert {key: digest for key, digest in now.items() if not key.startswith(("killed/", ".killed."))} == outside
    final = _write(bucket, "killed", _table(500), overwrite=True)
    assert final is not None and _check_complete(bucket, "killed") == 500
    listing = bucket.listing()
    assert not [key for key in listing if key.startswith(".killed.")], "staging objects or the lock were left behind"
    assert bucket.get("killed/train/NOTES.md") == b"kept through every kill"
