"""The dataset builder: a YAML config becomes a plan, the plan a Beam pipeline, and its staged output a
committed dataset (config -> plan -> graph -> commit).

Its rooms, lowest first, each importing only those before it (tests/test_layering.py): ``features``
(specs, conversion, file contents), ``config`` (the frozen config and its YAML), ``inputs`` (the
readers, the plan-time sample, progress counters), ``shuffle`` (keys, pieces, balanced shards),
``pipeline`` (feature resolution and inference, runners and workers, plan, graph, sequence builds,
splits, rows from a pipeline, commit) and ``running`` (launcher, ``write_dataset``, report).

May import every package below it, Apache Beam among them; the ``tfrbeam build`` command that drives
it is ``tfrbeam.cli.build``.

The Python API, imported lazily: ``run`` (a config path, dict or BuildConfig, built as ``tfrbeam
build`` builds it), ``write_dataset`` (Arrow data in memory) and ``WriteDataset`` (a PTransform
for a pipeline of your own); ``BuildResult`` is what the first two return.
"""

from __future__ import annotations

from tfrbeam.base.lazy_exports import lazy_exports

_EXPORTS = {
    "BuildResult": "tfrbeam.builder.running.launch",
    "WriteDataset": "tfrbeam.builder.pipeline.from_rows",
    "run": "tfrbeam.builder.running.launch",
    "write_dataset": "tfrbeam.builder.running.write_table",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)
