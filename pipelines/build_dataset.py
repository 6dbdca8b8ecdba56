"""Launcher: ``python -m pipelines.build_dataset CONFIG.yaml [--set k=v ...] [Beam options ...]``.

A thin call into ``tfrbeam.builder``, for running a build from a checkout without installing the
console script; ``tfrbeam build`` is the same command. Workers import only ``tfrbeam``.
"""

import sys

from tfrbeam.base.startup import imports_without_gc

if __name__ == "__main__":
    with imports_without_gc():
        from tfrbeam.cli.build import main
    from tfrbeam.builder.running.fork_server_process import start_early_server

    start_early_server(sys.argv[1:], fork_this_process=True)  # as tfrbeam build: --workers N forks its server now
    sys.exit(main())
