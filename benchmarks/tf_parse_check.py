"""By hand: TensorFlow parses a built dataset with its manifest's own spec, and gets our values.

Run from the repository root on a `tfrbeam build` directory (Example or SequenceExample):

    python -m benchmarks.tf_parse_check out/sequence_example [--venv-dir DIR]

Every record is decoded here with tfrbeam; then, in the throwaway tensorflow-cpu virtualenv that
`benchmarks/dataset.py --with-tf` uses (created on first use; TensorFlow is never a tfrbeam
dependency), `tf.data.TFRecordDataset` reads the shards and `tf.io.parse_single_example` /
`tf.io.parse_single_sequence_example` parse each record with the manifest's `parse_example_spec`
/ `parse_sequence_example_spec`, and the values are compared record by record (floats as
float32). Exits non-zero on the first difference, naming the record and the feature.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks.dataset import baseline_python
from tfrbeam.codec.example import decode_example, decode_sequence_example
from tfrbeam.layout.dataset_dir import DatasetDirectory
from tfrbeam.layout.manifest_schema import SEQUENCE_EXAMPLE
from tfrbeam.tfrecord.records import read_records

_TF_SIDE = r'''
import json, sys
import numpy as np
import tensorflow as tf

job = json.load(open(sys.argv[1]))
sequence = job["sequence"]
specs = {part: {name: eval(text) for name, text in spec.items()} for part, spec in job["spec"].items()}
records = [r.numpy() for r in tf.data.TFRecordDataset(job["paths"], compression_type=job["compression"])]
if len(records) != len(job["records"]):
    sys.exit(f"TensorFlow read {len(records)} records, tfrbeam {len(job['records'])}")


def values(tensor, steps):
    if isinstance(tensor, tf.SparseTensor):
        rows = tensor.indices.numpy()[:, 0]
        flat = tensor.values.numpy().tolist()
        return [[v for v, r in zip(flat, rows) if r == i] for i in range(steps)] if steps is not None else flat
    array = tensor.numpy()
    return [np.atleast_1d(step).tolist() for step in array] if steps is not None else np.atleast_1d(array).tolist()


def same(got, want):
    got = [g.hex() if isinstance(g, bytes) else g for g in got]
    if got and isinstance(got[0], float):
        return np.array_equal(np.float32(got), np.float32(want), equal_nan=True)
    return got == want


for number, (record, want) in enumerate(zip(records, job["records"])):
    if sequence:
        context, lists = tf.io.parse_single_sequence_example(
            record, context_features=specs["context_features"], sequence_features=specs["sequence_features"])
        pairs = [(name, values(t, None), want["context"][name]) for name, t in context.items() if name in want["context"]]
        for name, tensor in lists.items():
            steps = want["feature_lists"][name]
            got = values(tensor, len(steps))
            if [len(step) for step in got] != [len(step) for step in steps]:
                sys.exit(f"record {number}, feature list {name!r}: step lengths differ")
            pairs.append((name, [v for step in got for v in step], [v for step in steps for v in step]))
    else:
        parsed = tf.io.parse_single_example(record, specs["features"])
        pairs = [(name, values(t, None), want["features"].get(name, [])) for name, t in parsed.items()]
    for name, got, expected in pairs:
        if not same(got, expected):
            sys.exit(f"record {number}, feature {name!r}: TensorFlow {got[:5]} vs tfrbeam {expected[:5]}")
print(f"TensorFlow {tf.__version__} parsed {len(records)} records with the manifest's spec; every value equals tfrbeam's")
'''


def _json_values(values: list) -> list:
    return [value.hex() if isinstance(value, bytes) else value for value in values]


def _decoded(payload: bytes, sequence: bool) -> dict:
    if sequence:
        context, lists = decode_sequence_example(payload)
        return {"context": {name: _json_values(v) for name, v in context.items()},
                "feature_lists": {name: [_json_values(step) for step in steps] for name, steps in lists.items()}}
    return {"features": {name: _json_values(v) for name, v in decode_example(payload).items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset", type=pathlib.Path)
    parser.add_argument("--venv-dir", type=pathlib.Path, default=pathlib.Path(tempfile.gettempdir()) / "tfrbeam-bench-venvs")
    args = parser.parse_args()
    dataset = DatasetDirectory.find(str(args.dataset))
    if dataset is None:
        raise SystemExit(f"{args.dataset}: no tfrbeam_dataset.json (give a tfrbeam build directory)")
    sequence = dataset.record_type == SEQUENCE_EXAMPLE
    paths = [shard.path for shard in dataset.shards()]
    specs = dataset.manifest.rest
    job = {
        "sequence": sequence,
        "spec": specs["parse_sequence_example_spec"] if sequence else {"features": specs["parse_example_spec"]},
        "paths": paths,
        "compression": {"gzip": "GZIP", "zlib": "ZLIB"}.get(dataset.compression or "", None),
        "records": [_decoded(payload, sequence) for path in paths for payload in read_records(path)],
    }
    with tempfile.TemporaryDirectory() as work:
        job_path, script = pathlib.Path(work) / "job.json", pathlib.Path(work) / "tf_side.py"
        job_path.write_text(json.dumps(job))
        script.write_text(_TF_SIDE)
        python = baseline_python("tf.data", args.venv_dir, fresh=False)
        done = subprocess.run([str(python), str(script), str(job_path)], capture_output=True, text=True)
    print(done.stdout.strip() or done.stderr.strip().splitlines()[-1])
    sys.exit(done.returncode)


if __name__ == "__main__":
    main()
