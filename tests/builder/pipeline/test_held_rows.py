"""The rows a sequence build holds in this process between its converter and its encoder (tfrbeam.builder.pipeline.held_rows)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from apache_beam import coders
from apache_beam.options.pipeline_options import PipelineOptions

from tfrbeam.builder.pipeline.held_rows import (
    HeldRows,
    HeldRowsCoder,
    discard_held_rows,
    held_batches,
    hold_rows,
    release_rows,
    runs_holding_rows,
)
from tfrbeam.errors import HeldDataMissingError


def _batch(values: list[int]) -> pa.RecordBatch:
    return pa.record_batch({"v": values})


def test_a_run_holds_batches_until_each_is_released():
    first, second = hold_rows("run-a", _batch([1, 2])), hold_rows("run-a", _batch([3]))
    other = hold_rows("run-b", _batch([4]))
    assert (first.rows, second.rows) == (2, 1) and first.number != second.number
    assert [batch.column(0).to_pylist() for batch in held_batches([second, first])] == [[3], [1, 2]]
    release_rows([first])
    assert runs_holding_rows() == ["run-a", "run-b"]
    release_rows([second])  # the run's last batch: its entry goes
    assert runs_holding_rows() == ["run-b"]
    release_rows([second])  # released twice: nothing happens
    discard_held_rows("run-b")
    assert runs_holding_rows() == []
    with pytest.raises(HeldDataMissingError, match="is not held in this process"):
        held_batches([other])


def test_discarding_a_run_frees_only_its_rows():
    kept = hold_rows("kept", _batch([1]))
    hold_rows("failed", _batch([2]))
    discard_held_rows("failed")
    discard_held_rows("never-held")
    assert runs_holding_rows() == ["kept"]
    assert held_batches([kept])[0].num_rows == 1
    release_rows([kept])
    assert runs_holding_rows() == []


def test_the_reference_is_small_and_round_trips_through_its_coder():
    ref = HeldRows("/data/out/.tfrbeam-staging-ü", 2**40 + 3, 65536)
    coder = coders.registry.get_coder(HeldRows)
    assert isinstance(coder, HeldRowsCoder) and coder.is_deterministic()
    encoded = coder.encode(ref)
    assert coder.decode(encoded) == ref and len(encoded) < 64


@pytest.mark.parametrize("args, held", [
    ([], True), (["--direct_running_mode=multi_threading", "--direct_num_workers=2"], True),
    (["--direct_running_mode=multi_processing", "--direct_num_workers=2"], False), (["--piece_store=spill"], False),
    (["--piece_store=inline"], False),
])
def test_rows_are_held_exactly_when_the_pieces_are(tmp_path, args, held):
    """In-process runs (piece store memory) hold the rows; runs whose workers are other processes send the batches."""
    from tfrbeam.builder.config import parse_config
    from tfrbeam.builder.pipeline.plan import plan_build
    from tfrbeam.builder.pipeline.sequence import GroupKeyer

    (tmp_path / "in.csv").write_text("k,t\na,1\na,2\n")
    config = parse_config({"input": {"path": str(tmp_path / "in.csv")},
                                    "sequence": {"group_by": ["k"], "order_by": ["t"]},
                                    "output": {"path": str(tmp_path / "out")}})
    plan = plan_build(config, PipelineOptions(args))
    keyer = GroupKeyer.of(plan)
    assert (keyer.held_under == plan.staging_dir) is held and (keyer.held_under is None) is not held
    assert keyer.element_type == (tuple[int, HeldRows] if held else tuple[int, pa.RecordBatch])


def test_batches_past_the_budget_are_spilled_under_the_run_and_read_back(tmp_path):
    """A run keeps at most its budget of batches in memory; the batch past it sends them all to one Arrow file under
    its staging dir, which goes when the last of them is released."""
    from tfrbeam.builder.pipeline.held_rows import held_bytes
    from tfrbeam.layout.names import HELD_ROWS_DIR

    run = str(tmp_path / "staging")
    batches = [pa.record_batch({"v": list(range(start, start + 1000)), "s": [f"row {start + i:06d}" for i in range(1000)]})
               for start in range(0, 5000, 1000)]
    budget = 2 * batches[0].nbytes + 100
    refs = [hold_rows(run, batch, budget, bucket=index % 2) for index, batch in enumerate(batches)]
    in_memory, size = held_bytes(run)
    assert in_memory == 2 and size <= budget  # the third batch sent the first three to a file; the last two wait
    spilled = sorted((tmp_path / "staging" / HELD_ROWS_DIR).iterdir())
    assert len(spilled) == 1
    assert [batch.equals(original) for batch, original in zip(held_batches(refs[::-1]), batches[::-1])] == [True] * 5
    release_rows(refs[2:4])  # one spilled, one in memory: the file still holds two batches
    assert sorted((tmp_path / "staging" / HELD_ROWS_DIR).iterdir()) == spilled
    assert held_bytes(run) == (1, batches[4].nbytes)
    release_rows(refs[:2])  # the file's last batches: it goes
    assert list((tmp_path / "staging" / HELD_ROWS_DIR).iterdir()) == []
    release_rows(refs)
    assert runs_holding_rows() == []
    zero = hold_rows(run, batches[0], 0)  # a budget of 0 spills every batch
    assert held_bytes(run) == (0, 0) and held_batches([zero])[0].equals(batches[0])
    release_rows([zero])


def test_a_spilled_batch_that_is_gone_is_a_clear_error_and_releasing_it_only_warns(tmp_path, caplog):
    """Reading it back names the file; releasing it (a temp file's cleanup) must not fail the build."""
    from tfrbeam.layout.names import HELD_ROWS_DIR

    ref = hold_rows(str(tmp_path), _batch([1, 2, 3]), 0)
    (spilled,) = (tmp_path / HELD_ROWS_DIR).iterdir()
    spilled.unlink()
    with pytest.raises(HeldDataMissingError, match=r"held rows spilled there cannot be read back .*staging directory"):
        held_batches([ref])
    with caplog.at_level("WARNING", logger="tfrbeam.builder.shuffle.held"):
        release_rows([ref])
    assert "could not delete spilled held rows" in caplog.text
    assert runs_holding_rows() == []


@pytest.mark.parametrize("where", ["values", "end"])
def test_a_spilled_batch_changed_on_disk_is_refused_naming_its_file(tmp_path, where):
    """A flipped byte in an Arrow value buffer still decodes (to another value): the file's CRC32C refuses it."""
    from tfrbeam.errors import ShuffledDataError
    from tfrbeam.layout.names import HELD_ROWS_DIR

    batch = pa.record_batch({"v": list(range(1000, 2000))})
    ref = hold_rows(str(tmp_path), batch, 0)
    (spilled,) = (tmp_path / HELD_ROWS_DIR).iterdir()
    data = bytearray(spilled.read_bytes())
    at = data.find((1500).to_bytes(8, "little")) if where == "values" else len(data) - 1
    data[at] ^= 0x01
    spilled.write_bytes(bytes(data))
    with pytest.raises(ShuffledDataError, match=rf"{spilled}: held rows spilled there .*changed or damaged on disk"):
        held_batches([ref])
    release_rows([ref])
    assert runs_holding_rows() == []


def test_released_spill_files_are_unlinked_locally_without_beams_per_file_match(tmp_path, monkeypatch):
    """Issue 45: a 12M-row sequence build spent most of its time in Beam's delete (a glob match and metadata per
    spill file); local spill files are now unlinked one call each, and every released one is gone."""
    from apache_beam.io.filesystems import FileSystems

    run = str(tmp_path / "run")
    refs = [hold_rows(run, _batch([index]), budget=0) for index in range(50)]  # every batch spilled to a file
    spilled = sorted((tmp_path / "run").rglob("*.arrows"))
    assert len(spilled) == 50

    def no_beam_delete(paths):
        raise AssertionError(f"Beam's delete called for {len(paths)} local spill file(s)")

    monkeypatch.setattr(FileSystems, "delete", staticmethod(no_beam_delete))
    release_rows(refs)
    assert not list((tmp_path / "run").rglob("*.arrows")) and runs_holding_rows() == []


def test_spilled_batches_go_to_one_file_per_budget_and_a_bucket_reads_each_file_once(tmp_path, monkeypatch):
    """Issue 45: a 12M-row sequence build spilled one file per (source batch, bucket), so their number grew with rows
    times buckets (tens of thousands; writing, reading and deleting them took most of the build). Now every batch
    held when the budget is reached goes to one run file, a segment per bucket: files grow with the bytes spilled,
    and encoding a bucket reads one segment of each run."""
    from tfrbeam.builder.pipeline import held_rows
    from tfrbeam.builder.pipeline.held_rows import held_bytes
    from tfrbeam.layout.names import HELD_ROWS_DIR

    run = str(tmp_path / "run")
    sources, buckets = 30, 12
    batches = {(source, bucket): pa.record_batch({"v": [source * 1000 + bucket * 10 + row for row in range(5)]})
               for source in range(sources) for bucket in range(buckets)}
    budget = 40 * batches[0, 0].nbytes
    refs = {}
    for key, batch in batches.items():
        refs[key] = hold_rows(run, batch, budget, bucket=key[1])
        assert held_bytes(run)[1] <= budget
    files = sorted((tmp_path / "run" / HELD_ROWS_DIR).iterdir())
    assert 0 < len(files) <= len(batches) // 40 + 1  # one file per budget's worth (was one per spilled batch: 320)
    opened = []
    real_open = held_rows.fs.open_read
    monkeypatch.setattr(held_rows.fs, "open_read", lambda path: opened.append(path) or real_open(path))
    for bucket in range(buckets):
        mine = [refs[source, bucket] for source in range(sources)]
        opened.clear()
        values = sorted(value for batch in held_batches(mine) for value in batch.column("v").to_pylist())
        assert values == sorted(v for source in range(sources) for v in batches[source, bucket].column("v").to_pylist())
        assert len(opened) == len(set(opened)) <= len(files)  # each run file read once for the bucket
        release_rows(mine)
        if bucket < buckets - 1:  # every run holds rows of every bucket: its file goes with the last of them
            assert sorted((tmp_path / "run" / HELD_ROWS_DIR).iterdir()) == files
    assert list((tmp_path / "run" / HELD_ROWS_DIR).iterdir()) == [] and runs_holding_rows() == []


def test_batches_of_one_bucket_with_other_schemas_go_to_a_segment_each_and_read_back_as_they_were(tmp_path):
    """A run file joins a bucket's batches into one segment; batches whose schemas differ (never in a build, whose
    batches share the plan's features) get one segment per schema, not an error or a changed type."""
    run = str(tmp_path / "run")
    batches = [pa.record_batch({"v": pa.array([1, 2], pa.int64())}), pa.record_batch({"v": pa.array([3], pa.int32())}),
               pa.record_batch({"w": ["x"]}), pa.record_batch({"v": pa.array([4], pa.int64())})]
    budget = sum(batch.nbytes for batch in batches[:3])
    refs = [hold_rows(run, batch, budget, bucket=7) for batch in batches]
    assert len(list((tmp_path / "run").rglob("*.arrows"))) == 1
    back = held_batches(refs)
    assert [batch.schema for batch in back] == [batch.schema for batch in batches]
    assert all(batch.equals(original) for batch, original in zip(back, batches))
    release_rows(refs)
    assert runs_holding_rows() == [] and not list((tmp_path / "run").rglob("*.arrows"))
