"""Runners that lose elements tfrbeam's transforms rely on, refused when a pipeline is built.

Each entry was measured (README, "Runners"): a transform on such a runner would publish empty or
short output and report success, so tfrbeam fails loudly instead. The check is on the runner
the pipeline was created with, by its class name, because the loss happens inside the runner's
own translation, where no transform can see it.
"""

from __future__ import annotations

import apache_beam as beam

from tfrbeam.errors import UnsupportedRunnerError

__all__ = ["LOSSY_RUNNERS", "TAGGED_SIDE_INPUT_LOSERS", "refuse_lossy_runner"]

LOSSY_RUNNERS = {
    "DaskRunner": (
        "Beam's DaskRunner merges a ParDo's tagged outputs into its main output, runs only the pipeline's last leaf "
        "transform, turns beam.io.Read into a no-op and, before Beam 2.78, drops every element a DoFn emits in "
        "finish_bundle"
    ),
}


# Runners that lose the tagged outputs of a multi-output ParDo when they are read as a side input
# (for transforms that do so: the build's row counts and dead letters).
TAGGED_SIDE_INPUT_LOSERS = {
    "BundleBasedDirectRunner": (
        "Beam's BundleBasedDirectRunner hands a side input of a ParDo's tagged output the wrong elements (none, or "
        "the main output's as well), so the build's row counts would be wrong"
    ),
}


def refuse_lossy_runner(pipeline: beam.Pipeline, what: str, also: dict[str, str] | None = None) -> None:
    """Raise UnsupportedRunnerError if ``pipeline`` runs on a runner in LOSSY_RUNNERS (or ``also``); ``what`` names our
    transform."""
    name = type(pipeline.runner).__name__ if pipeline.runner is not None else ""
    reason = LOSSY_RUNNERS.get(name) or (also or {}).get(name)
    if reason:
        raise UnsupportedRunnerError(
            f"{what} cannot run on the {name}: {reason}, so it would write or read fewer records than it should "
            "and report success. Use the DirectRunner (multi_processing for several processes), the PortableRunner, "
            "Prism, Flink, Spark or Dataflow (see the README's runner table)"
        )
