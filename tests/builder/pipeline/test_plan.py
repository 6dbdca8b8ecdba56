"""What plan_build fixes before anything runs (tfrbeam/builder/pipeline/plan.py): here, how it names the runner."""

from __future__ import annotations

import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from tfrbeam.builder.config import parse_config
from tfrbeam.builder.pipeline.plan import plan_build
from tfrbeam.builder.pipeline.runners import runner_name


@pytest.mark.parametrize("args, name", [
    ([], "DirectRunner"),
    (["--runner=FnApiRunner"], "FnApiRunner"),
    (["--runner=apache_beam.runners.direct.direct_runner.DirectRunner"], "DirectRunner"),
    (["--runner=apache_beam.runners.portability.fn_api_runner.fn_runner.FnApiRunner"], "FnApiRunner"),
])
def test_the_plan_names_the_runner_as_the_runner_choice_does(tmp_path, args, name):
    """One home for a runner's name: the plan (and so the manifest and summary) and the piece-store choice agree."""
    (tmp_path / "in.csv").write_text("a,b\n1,x\n")
    config = parse_config({"input": {"path": str(tmp_path / "in.csv")}, "output": {"path": str(tmp_path / "out")}})
    options = PipelineOptions(args)
    assert plan_build(config, options).runner == runner_name(options) == name
