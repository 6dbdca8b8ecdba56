"""The dataset build: a YAML config becomes a plan, the plan a Beam pipeline, and its staged output a
committed dataset (config -> plan -> graph -> commit).

May import every package below it, Apache Beam among them; the ``tfrbeam build`` command that drives
it is ``tfrbeam.cli.build``.

The Python API, imported lazily: ``run`` (a config path, dict or BuildConfig, built as ``tfrbeam
build`` builds it), ``write_dataset`` (Arrow data in memory) and ``WriteDataset`` (a PTransform
for a pipeline of your own); ``BuildResult`` is what the first two return.
"""

from __future__ import annotations

from tfrbeam.base.lazy_exports import lazy_exports

_EXPORTS = {
    "BuildResult": "tfrbeam.build.launch",
    "WriteDataset": "tfrbeam.build.transform",
    "run": "tfrbeam.build.launch",
    "write_dataset": "tfrbeam.build.transform",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)
