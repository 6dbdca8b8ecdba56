"""tfrbeam uses Beam's public API only, so it installs beside a range of Beam releases (setup.py), not one minor.

Three ways a package ends up tied to one Beam minor, each checked over the whole package: importing a
private name, overriding a private hook of a Beam class, and reading or writing a Beam base class's
private fields from a subclass (the record range tracker once did all three).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pathlib
import pkgutil

import apache_beam as beam
import pytest
from apache_beam.io import iobase, source_test_utils

import tfrbeam
from tfrbeam.beam.source import TFRecordSource, _RecordRangeTracker
from tfrbeam.tfrecord.records import RecordWriter

PACKAGE = pathlib.Path(tfrbeam.__file__).parent
# Hooks Beam documents for subclasses to define (PipelineOptions subclasses declare their options in this one).
DOCUMENTED_HOOKS = {"_add_argparse_args"}


def _modules() -> list[str]:
    """The modules that may import Beam (tests/test_layering.py), but the ``__main__`` entry points (importing one runs it)."""
    return [info.name for info in pkgutil.walk_packages([str(PACKAGE)], "tfrbeam.")
            if info.name.startswith(("tfrbeam.beam.", "tfrbeam.builder.", "tfrbeam.cli.")) and not info.name.endswith("__main__")]


def _is_private(dotted: str) -> bool:
    return any(part.startswith("_") and not part.startswith("__") for part in dotted.split("."))


def test_no_module_imports_a_private_beam_name():
    found = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("apache_beam"):
                names = [f"{node.module}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names if alias.name.startswith("apache_beam")]
            else:
                continue
            found += [f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {name}" for name in names if _is_private(name)]
    assert not found, found


def _beam_subclasses() -> list[type]:
    classes = []
    for name in _modules():
        module = importlib.import_module(name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == name and any(base.__module__.startswith("apache_beam") for base in cls.__mro__[1:]):
                classes.append(cls)
    return classes


def test_no_class_overrides_or_touches_a_private_member_of_its_beam_base():
    """A private method redefined, or a private field of the base read or written (``self._x`` the base's __init__ set)."""
    found = []
    for cls in _beam_subclasses():
        beam_bases = [base for base in cls.__mro__[1:] if base.__module__.startswith("apache_beam")]
        base_fields = set()
        for base in beam_bases:
            with_init = base.__dict__.get("__init__")
            if with_init is not None and hasattr(with_init, "__code__"):
                source = inspect.getsource(with_init) if inspect.getsourcefile(with_init) else ""
                base_fields |= {node.attr for node in ast.walk(ast.parse(inspect.cleandoc("\n" + source)))
                                if isinstance(node, ast.Attribute) and node.attr.startswith("_")}
        own = {name for name in cls.__dict__ if name.startswith("_") and not name.startswith("__")}
        overridden = {name for name in own if any(name in vars(base) for base in beam_bases)} - DOCUMENTED_HOOKS
        touched = set()
        try:
            tree = ast.parse(inspect.cleandoc("\n" + inspect.getsource(cls)))
        except (OSError, TypeError):
            tree = ast.parse("")
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"
                    and node.attr in base_fields):
                touched.add(node.attr)
        if overridden or touched:
            found.append(f"{cls.__module__}.{cls.__qualname__}: overrides {sorted(overridden)}, touches {sorted(touched)}")
    assert not found, found


def test_the_subclass_check_sees_a_private_field_touched():
    """The check above is not vacuous: a tracker on Beam's OffsetRangeTracker writing its fields is caught."""
    from apache_beam.io.range_trackers import OffsetRangeTracker

    source = inspect.getsource(OffsetRangeTracker.__init__)
    fields = {node.attr for node in ast.walk(ast.parse(inspect.cleandoc("\n" + source))) if isinstance(node, ast.Attribute)}
    assert {"_stop_offset", "_last_record_start", "_lock"} <= fields


def test_the_record_range_tracker_keeps_the_offset_tracker_contract():
    tracker = _RecordRangeTracker(0, 100, lambda: True)
    assert tracker.try_split(50) is None  # unstarted
    assert tracker.try_claim_prefix([0, 10, 20]) == 3
    assert tracker.last_record_start == 20 and tracker.split_points() == (2, iobase.RangeTracker.SPLIT_POINTS_UNKNOWN)
    with pytest.raises(ValueError, match="not after the last attempted"):
        tracker.try_claim(20)
    assert tracker.try_split(20) is None  # at or before the last claimed start
    assert tracker.try_split(60) == (60, 0.6)
    assert tracker.stop_position() == 60 and tracker.position_at_fraction(0.5) == 30
    assert tracker.try_claim(59) and not tracker.try_claim(60)
    assert tracker.last_attempted_record_start == 60 and tracker.last_record_start == 59
    assert tracker.fraction_consumed() == pytest.approx(59 / 60)
    whole = _RecordRangeTracker(0, 100, lambda: False)
    whole.try_claim(0)
    assert whole.try_split(50) is None  # a file read whole is never split
    open_ended = _RecordRangeTracker(0, float("inf"), lambda: True)
    open_ended.try_claim(0)
    assert open_ended.try_split(50) is None and open_ended.fraction_consumed() == 0.0


def _records_file(path: pathlib.Path, count: int) -> pathlib.Path:
    with RecordWriter(str(path)) as writer:
        writer.write_many([f"record {i:05d} ".encode() * 7 for i in range(count)])
    return path


def test_the_source_reads_splits_and_rebalances_as_beams_own_file_sources_do(tmp_path):
    """Across files (the ConcatSource the pattern becomes); tests/beam/test_source.py checks one file in depth."""
    for index in range(3):
        _records_file(tmp_path / f"part-{index}.tfrecord", 400)
    source = TFRecordSource(str(tmp_path / "part-*.tfrecord"), split_unindexed=True)
    expected = source_test_utils.read_from_source(source)
    assert len(expected) == 1200
    bundles = list(source.split(desired_bundle_size=20_000))
    assert len(bundles) > 3
    source_test_utils.assert_sources_equal_reference_source((source, None, None), [
        (bundle.source, bundle.start_position, bundle.stop_position) for bundle in bundles])
    # Dynamic work rebalancing at every position of one file's range (Beam's exhaustive check).
    one = TFRecordSource(str(_records_file(tmp_path / "small.tfrecord", 12)), split_unindexed=True)
    (file_bundle,) = list(one.split(desired_bundle_size=1 << 30))
    source_test_utils.assert_split_at_fraction_exhaustive(file_bundle.source, perform_multi_threaded_test=False)


def test_a_pattern_that_matches_nothing_says_how_to_fix_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="pass validate=False"):
        TFRecordSource(str(tmp_path / "missing-*"))
    assert list(TFRecordSource(str(tmp_path / "missing-*"), validate=False).split(100)) == []
    with pytest.raises(TypeError, match="file_pattern"):
        TFRecordSource(42)


def test_tagged_with_step_lets_our_error_reach_the_caller_as_is(tmp_path):
    """The one Beam behaviour relied on beyond its API: an error marked ``_tagged_with_step`` is re-raised as is.

    Without it, Beam would rebuild our error from its message as a RuntimeError (our errors take
    structured arguments); the message would still name the file and offset.
    """
    from tfrbeam.beam.source import ReadFromTFRecord
    from tfrbeam.errors import CorruptRecordError

    path = tmp_path / "bad.tfrecord"
    with RecordWriter(str(path)) as writer:
        writer.write_many([b"x" * 100, b"y" * 100])
    data = bytearray(path.read_bytes())
    data[20] ^= 0xFF  # inside the first payload: its data CRC fails
    path.write_bytes(bytes(data))
    pipeline = beam.Pipeline()
    _ = pipeline | ReadFromTFRecord(str(path))
    with pytest.raises(CorruptRecordError, match=r"bad\.tfrecord"):  # our type, not a RuntimeError rebuilt from text
        pipeline.run().wait_until_finish()
