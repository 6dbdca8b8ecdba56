"""Read TFRecord datasets of tf.train.Examples (and SequenceExamples) for training, without TensorFlow.

``open_dataset(path)`` gives batches as numpy arrays (or Arrow record batches), read in
parallel, interleaved, shuffled and prefetched like tf.data, shardable across data-parallel
workers and resumable from a saved position; ``open_random_access(path)`` reads any record by
number (Grain and PyTorch map-style sources). Both take TFDS's split strings (``train[:10%]+eval``), and
``even_splits`` cuts one into parts for hosts; ``mix`` draws records from several datasets at given weights.
``DatasetDirectory`` answers what a built dataset holds (its ``Manifest``, splits, shards, compression), as every tool asks it.

May import ``tfrbeam.layout``, ``tfrbeam.codec``, ``tfrbeam.tfrecord``, ``tfrbeam.base`` and
``tfrbeam.errors``; never Apache Beam.
"""

from tfrbeam.dataset.columns import Ragged
from tfrbeam.dataset.mixing import MixedDataset, mix
from tfrbeam.dataset.pipeline import Dataset, open_dataset
from tfrbeam.dataset.random_access import RandomAccessDataset, open_random_access
from tfrbeam.dataset.spec import FixedLenFeature, FixedLenSequenceFeature, VarLenFeature, VarLenSequenceFeature
from tfrbeam.dataset.splits import even_splits
from tfrbeam.layout.dataset_dir import DatasetDirectory
from tfrbeam.layout.manifest_schema import Manifest

__all__ = ["Dataset", "DatasetDirectory", "FixedLenFeature", "FixedLenSequenceFeature", "Manifest", "MixedDataset",
           "RandomAccessDataset", "Ragged", "VarLenFeature", "VarLenSequenceFeature", "even_splits", "mix", "open_dataset",
           "open_random_access"]
