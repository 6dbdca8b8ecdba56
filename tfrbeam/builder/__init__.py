"""The dataset builder: a YAML config becomes a plan, the plan a Beam pipeline, and its staged output a
committed dataset (config -> plan -> graph -> commit).

Its rooms: ``config`` (the frozen config and its YAML), ``features`` (specs, inference, conversion, file
contents), ``inputs`` (the readers), ``shuffle`` (keys, pieces, balanced shards), ``pipeline`` (plan,
graph, sequence builds, splits, rows in memory, commit) and ``running`` (launcher, runners, progress,
report).

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
    "write_dataset": "tfrbeam.builder.pipeline.from_rows",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)
