"""The dataset build: a YAML config becomes a plan, the plan a Beam pipeline, and its staged output a
committed dataset (config -> plan -> graph -> commit).

May import every package below it, Apache Beam among them; the ``tfrbeam build`` command that drives
it is ``tfrbeam.cli.build``.
"""
