"""``python -m tfrbeam.build CONFIG.yaml [--set key.path=value ...] [--overwrite] [Beam options ...]``: the same as ``tfrbeam
build``."""

import sys

from tfrbeam.base.startup import imports_without_gc

with imports_without_gc():
    from tfrbeam.cli.build import main

sys.exit(main())
