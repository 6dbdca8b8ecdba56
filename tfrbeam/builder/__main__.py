"""``python -m tfrbeam.builder CONFIG.yaml [--set key.path=value ...] [--overwrite] [Beam options ...]``: ``tfrbeam build``."""

import sys

from tfrbeam.cli.build import main

sys.exit(main())
