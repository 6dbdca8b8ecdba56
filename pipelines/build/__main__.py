"""``python -m pipelines.build CONFIG.yaml [--set key.path=value ...] [--overwrite] [Beam options ...]``."""

import sys

from tfrbeam.startup import imports_without_gc

with imports_without_gc():
    from pipelines.build.cli import main

sys.exit(main())
