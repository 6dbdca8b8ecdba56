"""A feature every record has but that never holds a value: inferred so that reading it works (not a fixed shape (0,))."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO_ROOT
from tfrbeam.codec.example import encode_example
from tfrbeam.tfrecord.records import RecordWriter

_READ = """
import json, sys
sys.path.insert(0, {repo!r})
from tfrbeam.dataset import open_dataset
ds = open_dataset(sys.argv[1], batch_size=4, executor="threads")
spec = {{name: type(feature).__name__ for name, feature in ds.features.items()}}
batches = [{{"x": batch["x"].tolist(), "empty": [list(map(int, row)) for row in batch["empty"].to_list()]}}
           for batch in ds]
print(json.dumps({{"spec": spec, "batches": batches}}))
"""


def test_a_feature_present_in_every_record_with_no_values_reads_in_a_subprocess(tmp_path):
    """In a subprocess: a fixed_size_list of size 0 kills the process with SIGFPE inside pyarrow."""
    path = tmp_path / "empty.tfrecord"
    with RecordWriter(str(path)) as writer:
        writer.write_many([encode_example({"x": [index], "empty": []}, kinds={"empty": "int64"}) for index in range(6)])
    done = subprocess.run([sys.executable, "-c", _READ.format(repo=str(REPO_ROOT)), str(path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"reading crashed (exit {done.returncode}): {done.stderr[-2000:]}"
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["spec"] == {"empty": "VarLenFeature", "x": "FixedLenFeature"}
    assert [batch["x"] for batch in result["batches"]] == [[0, 1, 2, 3], [4, 5]]
    assert [batch["empty"] for batch in result["batches"]] == [[[]] * 4, [[]] * 2]
