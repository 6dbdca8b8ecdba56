"""TFRecord framing: the record format (``records``), many frames at once with numpy (``frames``),
blocks of records read in bulk (``blocks``), the read index that lets a reader start at any record
(``record_index``) and the DALI-style offset index for random access (``offset_index``). The one
framing implementation in tfrbeam.

May import ``tfrbeam.base`` and ``tfrbeam.errors``; never Apache Beam.
"""
