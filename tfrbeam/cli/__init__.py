"""The ``tfrbeam`` command: its subcommands (``main``), the build command (``build``), the exit status of every
error (``exit_codes``), the file tools behind cat, inspect and verify (``file_tools``) and the demo data (``demo_data``).

The top layer: may import every package below it, and imports Beam only through ``beam`` and ``builder``.
Nothing imports it but the entry points (``python -m tfrbeam.builder``, ``pipelines/``).
"""
