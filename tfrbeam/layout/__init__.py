"""The home of the dataset directory: its names (``names``), the confinement of paths inside it
(``paths``), its manifest (``manifest``: write, read, verify) and the manifest's schema and frozen
``Manifest`` (``manifest_schema``), the directory every tool asks (``dataset_dir.DatasetDirectory``: splits,
shards, compression, record type, generation), and whether a dataset is still the generation a reader
started on (``generation``). See docs/trust.md.

May import ``tfrbeam.codec``, ``tfrbeam.tfrecord``, ``tfrbeam.base`` and ``tfrbeam.errors`` (the
manifest verifies shards by reading their records); never Apache Beam. Atomic writes live in
``tfrbeam.base.fileops``, below framing, because the framing writer writes shards atomically too.
"""
