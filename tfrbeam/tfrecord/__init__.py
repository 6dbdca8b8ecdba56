"""TFRecord framing: the record format and its compression (``records``), many frames at once with
numpy (``frames``), blocks of records read in bulk (``blocks``), and the read index beside each file
(``read_index``: where its records start, to split it, seek in it or read any record at once). The one
framing implementation in tfrbeam, and the one compression resolver.

May import ``tfrbeam.base`` and ``tfrbeam.errors``; never Apache Beam.
"""
