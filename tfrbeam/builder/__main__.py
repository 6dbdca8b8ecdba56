"""``python -m tfrbeam.builder CONFIG.yaml [--set key.path=value ...] [--overwrite] [Beam options ...]``: the same as ``tfrbeam
build``."""

import sys

from tfrbeam.base.startup import imports_without_gc
from tfrbeam.builder.running.fork_server_process import start_early_server

with imports_without_gc():
    from tfrbeam.cli.build import main

# Beam is imported and this is still the only thread: the workers' fork server is this process forked.
start_early_server(sys.argv[1:], fork_this_process=True)
sys.exit(main())
