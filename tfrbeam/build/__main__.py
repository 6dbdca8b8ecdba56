"""``python -m tfrbeam.build CONFIG.yaml [--set key.path=value ...] [--overwrite] [Beam options ...]``: the same as ``tfrbeam
build``."""

import sys

from tfrbeam.base.startup import imports_without_gc
from tfrbeam.build.fork_server_process import start_early_server

start_early_server(sys.argv[1:])  # before Beam is imported: the server imports it meanwhile
with imports_without_gc():
    from tfrbeam.cli.build import main

sys.exit(main())
