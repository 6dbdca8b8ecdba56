"""Padding keeps zeros distinguishable from missing values; the reader's errors say what is wrong."""

from __future__ import annotations

import numpy as np
import pytest

from tfrbeam.codec.example import encode_example
from tfrbeam.dataset import VarLenFeature, open_dataset
from tfrbeam.errors import ConfigError
from tfrbeam.tfrecord.records import RecordWriter

SPEC = {"tags": VarLenFeature("int64"), "names": VarLenFeature("bytes")}


@pytest.fixture()
def files(tmp_path):
    rows = [{"tags": [0, 5], "names": [b"a"]}, {}, {"tags": [0], "names": [b"b", b"c"]}]  # the middle one lacks both
    with RecordWriter(str(tmp_path / "a.tfrecord")) as writer:
        writer.write_many([encode_example(row) for row in rows])
    return str(tmp_path / "*.tfrecord")


def _batch(files, **options):
    return next(iter(open_dataset(files, feature_spec=SPEC, batch_size=3, executor="threads", **options)))


def test_padding_defaults_to_zero_and_the_mask_tells_a_padded_zero_from_a_real_one(files):
    batch = _batch(files, padded=True, return_mask=True)
    assert batch["tags"].tolist() == [[0, 5], [0, 0], [0, 0]]
    assert batch["tags__mask"].tolist() == [[True, True], [False, False], [True, False]]
    assert batch["names__mask"].tolist() == [[True, False], [False, False], [True, True]]
    assert batch["tags__mask"].dtype == np.bool_


def test_pad_value_for_all_or_per_feature(files):
    assert _batch(files, padded=True, pad_value=-1)["tags"].tolist() == [[0, 5], [-1, -1], [0, -1]]
    batch = _batch(files, padded={"tags": 3, "names": None}, pad_value={"names": b"?"})
    assert batch["tags"].tolist() == [[0, 5, 0], [0, 0, 0], [0, 0, 0]]
    assert batch["names"].tolist() == [[b"a", b"?"], [b"?", b"?"], [b"b", b"c"]]
    assert "tags__mask" not in batch


def test_padding_options_are_checked(files):
    with pytest.raises(ConfigError, match="return_mask=True marks padded positions: pass padded="):
        open_dataset(files, feature_spec=SPEC, return_mask=True)
    with pytest.raises(ConfigError, match=r"pad_value names \['nope'\] that are not padded features"):
        open_dataset(files, feature_spec=SPEC, padded=["tags"], pad_value={"nope": 1})


def test_a_missing_directory_is_said_to_be_missing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"'out/demo' does not exist \(relative paths are from .*\)"):
        open_dataset("out/demo", split="train")


@pytest.mark.parametrize("change, named", [({"batch_size": 2}, "batch_size"), ({"seed": 8}, "seed"),
                                          ({"shuffle_buffer": 4}, "shuffle_buffer")])
def test_a_state_from_other_arguments_names_the_argument(files, change, named):
    options = {"batch_size": 1, "seed": 7, "shuffle_buffer": 2}
    dataset = open_dataset(files, feature_spec=SPEC, executor="threads", **options)
    iterator = iter(dataset)
    next(iterator)
    state = dataset.state_dict()
    other = open_dataset(files, feature_spec=SPEC, executor="threads", **{**options, **change})
    with pytest.raises(ConfigError, match=rf"saved by a dataset with other {named}\b"):
        other.load_state_dict(state)
