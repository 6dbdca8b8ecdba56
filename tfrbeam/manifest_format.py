"""The dataset manifest's fixed names, shared by the build that writes it and the readers and tools that read it."""

from __future__ import annotations

MANIFEST_NAME = "dataset_info.json"  # written last, in the dataset directory
MANIFEST_FORMAT = "tfrbeam-dataset/1"
TF_DTYPES = {"int64": "tf.int64", "float": "tf.float32", "bytes": "tf.string"}  # feature type -> TensorFlow dtype
