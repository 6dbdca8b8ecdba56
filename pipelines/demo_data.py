"""Launcher: ``python -m pipelines.demo_data [DIR]``, the same as ``tfrbeam demo-data [DIR]``.

The demo data's writer lives in ``tfrbeam.cli.demo_data`` so that an installed package has it too.
"""

import sys

from tfrbeam.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["demo-data", *sys.argv[1:]]))
