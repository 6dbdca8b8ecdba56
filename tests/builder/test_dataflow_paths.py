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
