"""The tf.train.Example and SequenceExample codec: the protos, per-message encode and decode
(``example``), the columnar paths between Arrow record batches and serialized records (``encode``,
``decode``, ``sequence_encode``, ``sequence_decode``), the wire-level numpy reads both decoders share
(``wire``), the kinds and their Arrow types (``kinds``), values as JSON (``json_values``) and the one inference of
a TFRecord's features from its records (``infer``).

May import ``tfrbeam.tfrecord``, ``tfrbeam.base`` and ``tfrbeam.errors``; never Apache Beam.
"""
