"""The one feature inference (tfrbeam.codec.infer): what a sample of records shows of each feature.

Its rules, checked on their own; then each of the three readers that infer features (open_dataset's spec, the
build's TFRecord input schema, ``tfrbeam inspect``'s parse spec) is held to it, as that reader states its result.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tfrbeam.codec.decode import examples_to_record_batch
from tfrbeam.codec.example import decode_example, encode_example
from tfrbeam.codec.infer import FeatureSample, InferredFeature, KindCount, infer_column, infer_columns
from tfrbeam.codec.kinds import ARROW_TYPES, TF_DTYPES
from tfrbeam.tfrecord.records import RecordWriter


def inferred(records: list[bytes]) -> dict[str, InferredFeature]:
    batch = examples_to_record_batch(records)
    return infer_columns(zip(batch.schema.names, batch.columns), batch.num_rows)


def test_one_value_in_every_record_is_a_scalar_n_values_a_fixed_shape_anything_else_variable_length():
    kinds = {"empty": "int64", "some": "bytes"}
    records = [encode_example({"one": 1, "three": [1.0, 2.0, 3.0], "some": [b"a"] * n, "gaps": [1] if n < 3 else None,
                               "empty": []}, kinds=kinds) for n in range(1, 4)] + \
              [encode_example({"one": 2, "three": [0.0] * 3, "some": [], "gaps": [2], "empty": []}, kinds=kinds)]
    features = inferred(records)
    assert {name: (feature.kind, feature.shape) for name, feature in features.items()} == {
        "empty": ("int64", None), "gaps": ("int64", None), "one": ("int64", ()), "some": ("bytes", None),
        "three": ("float", (3,)),
    }
    assert (features["gaps"].present, features["gaps"].always_present, features["one"].always_present) == (3, False, True)
    assert (features["some"].min_values, features["some"].max_values) == (0, 3)


def test_a_feature_with_no_kind_has_no_type_and_one_held_as_two_kinds_has_no_one_kind():
    sample = FeatureSample()
    sample.add_batch(examples_to_record_batch([encode_example({"x": [], "y": [1]}, kinds={"x": None})]))
    sample.add_batch(examples_to_record_batch([encode_example({"y": [b"a"]}), encode_example({"y": [b"b"]})]))
    sample.add_batch(examples_to_record_batch([encode_example({"y": [2, 3]})]))
    x, y = sample.features()["x"], sample.features()["y"]
    assert (x.kinds, x.kind, x.majority_kind, x.present, x.shape) == ((), None, None, 1, None)
    assert (y.kinds, y.kind, y.majority_kind, y.shape, y.one_value_each) == (("int64", "bytes"), None, "int64", None, False)
    assert dict(y.by_kind) == {"int64": KindCount(2, 1, 2), "bytes": KindCount(2, 1, 1)}
    assert (sample.records, y.always_present, x.always_present) == (4, True, False)


def test_a_feature_lists_steps_are_its_rows():
    """A feature list's steps (one column's flattened rows) are its sample: one value in every step is a scalar step."""
    steps = pa.array([[[1], [2]], [[3]], []], pa.list_(pa.list_(pa.int64()))).flatten()
    feature = infer_column("ids", steps)
    assert (feature.sampled, feature.present, feature.kind, feature.shape) == (3, 3, "int64", ())


def test_a_feature_list_with_no_steps_keeps_its_kind_and_is_variable_length():
    feature = infer_column("ids", pa.array([], pa.list_(pa.int64())))
    assert (feature.kind, feature.present, feature.shape, feature.majority_kind) == ("int64", 0, None, "int64")
    sample = FeatureSample()
    sample.add_columns([("x", pa.array([None, None], pa.list_(pa.float32())))], 2)
    sample.add_columns([("x", pa.array([[1.0], [2.0, 3.0]], pa.list_(pa.float32())))], 2)
    assert dict(sample.features()["x"].by_kind) == {"float": KindCount(2, 1, 2)}


def test_records_added_one_at_a_time_count_as_a_batch_of_them_does():
    records = [encode_example({"a": [1] * (n % 3), "b": b"x" if n % 2 else None, "c": 0.5}, kinds={"a": "int64"})
               for n in range(7)]
    one_by_one = FeatureSample()
    for record in records:
        one_by_one.add_decoded(decode_example(record, kinds=True))
    assert one_by_one.features() == inferred(records)


# ------------------------------------------------------------------ the readers that infer features agree with it

KIND_VALUES = {"int64": st.integers(-5, 5), "float": st.floats(-1, 1, width=32), "bytes": st.binary(max_size=3)}


@st.composite
def example_sets(draw) -> list[bytes]:
    """Records whose features keep one kind each (held with no kind, or left out, in some records)."""
    kinds = draw(st.dictionaries(st.sampled_from("abcde"), st.sampled_from(sorted(KIND_VALUES)), min_size=1))
    records = []
    for _ in range(draw(st.integers(1, 8))):
        features, declared = {}, {}
        for name, kind in kinds.items():
            choice = draw(st.sampled_from(["values", "values", "values", "absent", "no kind"]))
            if choice == "values":
                features[name] = draw(st.lists(KIND_VALUES[kind], max_size=3))
                declared[name] = kind
            elif choice == "no kind":
                features[name], declared[name] = [], None
        records.append(encode_example(features, kinds=declared))
    return records


def written(tmp_path_factory, records: list[bytes]) -> str:
    path = str(tmp_path_factory.mktemp("infer") / "f.tfrecord")
    with RecordWriter(path) as writer:
        for record in records:
            writer.write(record)
    return path


SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@SETTINGS
@given(records=example_sets())
def test_open_datasets_inferred_spec_is_the_one_inference(tmp_path_factory, records):
    from tfrbeam.dataset.spec import FixedLenFeature, ShardFile, VarLenFeature, infer_feature_spec

    expected = {name: FixedLenFeature(feature.shape, feature.kind) if feature.shape is not None
                else VarLenFeature(feature.kind)
                for name, feature in inferred(records).items() if feature.kind is not None}
    assert infer_feature_spec([ShardFile(written(tmp_path_factory, records), None)]) == expected


@SETTINGS
@given(records=example_sets())
def test_the_builds_tfrecord_input_schema_is_the_one_inference(tmp_path_factory, records):
    from tfrbeam.builder.config.schema import InputConfig
    from tfrbeam.builder.inputs.tfrecord import tfrecord_inputs, tfrecord_schema

    config = InputConfig(format="tfrecord", path=written(tmp_path_factory, records))
    features = inferred(records)
    expected = pa.schema([
        pa.field(name, ARROW_TYPES[kind] if feature.one_value_each else pa.list_(ARROW_TYPES[kind]),
                 nullable=not feature.always_present)
        for name, feature in sorted(features.items()) if (kind := feature.majority_kind) is not None
    ])
    assert tfrecord_schema(config, tfrecord_inputs(config)) == expected


@SETTINGS
@given(records=example_sets())
def test_inspects_parse_spec_is_the_one_inference(tmp_path_factory, records):
    from tfrbeam.cli.file_tools import inspect_files

    features = inferred(records)

    def parse_spec(feature: InferredFeature) -> str:
        dtype = TF_DTYPES[feature.kind]
        if feature.shape is None:
            return f"tf.io.VarLenFeature({dtype})"
        return f"tf.io.FixedLenFeature({list(feature.shape)}, {dtype})".replace("[()]", "[]")

    expected = {name: parse_spec(feature) for name, feature in sorted(features.items()) if feature.kind is not None}
    assert inspect_files([written(tmp_path_factory, records)]).parse_example_spec() == expected


@pytest.mark.parametrize("kinds", [{"x": "int64"}, {"x": None}])
def test_a_feature_every_record_holds_empty(kinds):
    """Variable-length to the one inference (a fixed shape (0,) says nothing a reader can use)."""
    feature = inferred([encode_example({"x": []}, kinds=kinds)] * 2)["x"]
    assert (feature.shape, feature.always_present, feature.max_values) == (None, True, 0)
