"""Launcher: ``python -m pipelines.build_dataset CONFIG.yaml [--set k=v ...] [Beam options ...]``.

A thin call into ``tfrbeam.build``, for running a build from a checkout without installing the
console script; ``tfrbeam build`` is the same command. Workers import only ``tfrbeam``.
"""

import sys

from tfrbeam.base.startup import imports_without_gc

if __name__ == "__main__":
    with imports_without_gc():
        from tfrbeam.cli.build import main

    sys.exit(main())
