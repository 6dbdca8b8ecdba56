"""A Dataflow build refuses paths its workers cannot see, before anything runs (issue 42 item 9)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.storage_servers import StoreBucket  # noqa: F401  (the bucket fixtures' type)
from tfrbeam.builder.config import parse_config
from tfrbeam.builder.pipeline.plan import plan_build
from tfrbeam.errors import ConfigError

DATAFLOW = ["--runner=DataflowRunner", "--project=p", "--region=us-central1", "--temp_location=gs://b/tmp"]


def _config(input_path: str, output_path: str):
    return parse_config({"input": {"path": input_path, "format": "parquet"}, "output": {"path": output_path}})


@pytest.fixture
def table_file(tmp_path):
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"x": [1, 2, 3]}), path)
    return str(path)


def test_a_dataflow_build_refuses_a_local_output_in_one_line(table_file, tmp_path, gcs_bucket):
    from apache_beam.options.pipeline_options import PipelineOptions

    gcs_bucket.put("in/rows.parquet", open(table_file, "rb").read())
    with pytest.raises(ConfigError, match=r"output.path: .*out is on this machine, but DataflowRunner's workers") as error:
        plan_build(_config(gcs_bucket.url("in/rows.parquet"), str(tmp_path / "out")), PipelineOptions(DATAFLOW))
    assert "\n" not in str(error.value)
    assert not (tmp_path / "out").exists()


def test_a_dataflow_build_refuses_a_local_input(table_file, gcs_bucket):
    from apache_beam.options.pipeline_options import PipelineOptions

    with pytest.raises(ConfigError, match=r"input.path: .*rows.parquet is on this machine"):
        plan_build(_config(table_file, gcs_bucket.url("out")), PipelineOptions(DATAFLOW))


@pytest.mark.parametrize("spelling", ["dataflow", "Dataflow", "dataflowrunner"])
def test_beams_short_runner_names_are_the_runner_they_name(table_file, gcs_bucket, spelling):
    """Beam takes ``--runner dataflow`` (any case, "Runner" optional) for DataflowRunner; so does every check of ours."""
    from apache_beam.options.pipeline_options import PipelineOptions

    options = PipelineOptions([f"--runner={spelling}", *DATAFLOW[1:]])
    with pytest.raises(ConfigError, match=r"input.path: .*rows.parquet is on this machine, but DataflowRunner's workers"):
        plan_build(_config(table_file, gcs_bucket.url("out")), options)


@pytest.mark.parametrize(("spelling", "name", "local"), [
    ("direct", "DirectRunner", True), ("DIRECTRUNNER", "DirectRunner", True), ("prism", "PrismRunner", True),
    ("apache_beam.runners.direct.direct_runner.DirectRunner", "DirectRunner", True),
    ("dataflow", "DataflowRunner", False), ("my.own.Runner", "Runner", False),
])
def test_a_runner_is_named_as_beam_resolves_it(spelling, name, local):
    from apache_beam.options.pipeline_options import PipelineOptions

    from tfrbeam.builder.pipeline.runners import runner_name, uses_local_workers

    options = PipelineOptions([f"--runner={spelling}"])
    assert (runner_name(options), uses_local_workers(options)) == (name, local)
