"""Launcher: ``python -m pipelines.build_dataset CONFIG.yaml [--set k=v ...] [Beam options ...]``.

A thin call into ``tfrbeam build`` (``tfrbeam.cli.build.main``), for running a build from a checkout
without installing the console script. Workers import only ``tfrbeam``.
"""

import sys

from tfrbeam.cli.build import main

if __name__ == "__main__":
    sys.exit(main())
