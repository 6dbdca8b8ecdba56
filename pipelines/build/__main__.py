"""``python -m pipelines.build CONFIG.yaml [--set key.path=value ...] [--overwrite] [Beam options ...]``."""

import sys

from pipelines.build.cli import main

sys.exit(main())
