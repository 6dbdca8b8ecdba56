"""The build's progress display and summary (tfrbeam/builder/running/report.py), shared by tfrbeam build and the Python API.

Progress counted across worker processes and the bar on a real terminal are tested end to end in
tests/cli/test_build.py; the summary through tfrbeam.builder.run in tests/builder/running/test_launch.py.
"""

from __future__ import annotations

import re


def test_the_progress_bar_moves_on_to_the_shuffle_and_write_phase_and_prints_log_lines_above_itself(capsys):
    import logging

    from tfrbeam.builder.running.report import _ProgressBar

    logging.basicConfig(format="%(levelname)s %(message)s", force=True)
    try:
        bar = _ProgressBar(1000)
        bar.show((10, 400), (0, 0))
        assert not bar.writing and bar.bar.n == 400 and bar.bar.desc.startswith("reading")
        logging.getLogger("tfrbeam.test").warning("a line while the bar is drawn")
        bar.show((25, 990), (0, 0))
        assert not bar.writing  # still reading: a few input bytes are left
        bar.show((25, 990), (7, 700))  # a shard writer reported: reading is over
        assert bar.writing and bar.bar.desc.startswith("shuffling and writing")
        assert (bar.bar.total, bar.bar.n) == (25, 7)
        bar.show((25, 1000), (25, 2500))
        assert bar.bar.n == 25
        bar.close()
    finally:
        logging.basicConfig(force=True)
    err = capsys.readouterr().err
    line = next(part for part in re.split(r"[\r\n]", err) if "a line while the bar is drawn" in part)
    assert line == "WARNING a line while the bar is drawn"  # on a line of its own, not appended to the bar
    assert any(part.startswith("shuffling and writing") for part in err.split("\r")), err


def test_the_summary_says_how_the_run_went_from_the_run_record_or_a_format_1_manifests_top_level():
    from types import SimpleNamespace

    from tfrbeam.builder.running.report import summary_table
    from tfrbeam.layout.manifest_schema import Manifest

    run = {"run_id": "r", "runner": "PortableRunner", "piece_store": "spill", "shuffled_bytes": 9,
           "workers": {"count": 2, "mode": "multi_processing", "chosen_by": "--workers 2"}}
    dataset = {"rows_read": 10, "bad_records": {"count": 0, "action": "fail"},
               "splits": {"train": {"num_examples": 10, "num_bytes": 99, "shards": [{"path": "train/a", "num_examples": 10}]}}}
    plan = SimpleNamespace(manifest_path="out/tfrbeam_dataset.json")
    format_2 = Manifest.from_dict({"format": "tfrbeam-dataset/2", **dataset, "run": run}, "m")
    format_1 = Manifest.from_dict({"format": "tfrbeam-dataset/1", **dataset, **run}, "m")
    written = summary_table(format_2, 2.0, plan)  # type: ignore[arg-type]
    before = summary_table(format_1, 2.0, plan)  # type: ignore[arg-type]
    assert "time:       2.0 s (5 rows/s, runner PortableRunner, 2 worker processes, piece store spill)" in written
    assert before == written
