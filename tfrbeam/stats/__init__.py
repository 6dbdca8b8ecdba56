"""Dataset statistics (per-split sketches, drift between splits, the JSON and HTML report) and the
Parquet export beside them (``export``).

Sits above ``tfrbeam.dataset``: a glob of TFRecord files is read through ``open_dataset``. May import
every package below it; never Apache Beam (the Beam transforms are in ``tfrbeam.beam``).
"""
