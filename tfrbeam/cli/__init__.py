"""The ``tfrbeam`` command: its subcommands (``main``), the build command (``build``), the file tools
behind cat, inspect and verify (``file_tools``) and the demo data (``demo_data``).

The top layer: may import every package below it. Nothing imports it but ``python -m tfrbeam.builder``.
"""
