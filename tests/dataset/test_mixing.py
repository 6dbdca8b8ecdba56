"""``tfrbeam.mix``: records of several datasets or splits at given weights, deterministic for a seed, resumable."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

import tfrbeam
from tfrbeam.codec.example import encode_example
from tfrbeam.dataset import open_dataset
from tfrbeam.errors import ConfigError
from tfrbeam.tfrecord.records import RecordWriter

SPLITS = {"big": (0, [400, 0, 350, 250]), "small": (5000, [60, 40])}  # first id, shard sizes


@pytest.fixture(scope="module")
def dataset_dir(tmp_path_factory) -> pathlib.Path:
    """Splits "big" (1000 records) and "small" (100); each record's id, and a tags list of id % 4 values."""
    root = tmp_path_factory.mktemp("mix") / "ds"
    root.mkdir()
    splits = {}
    for split, (first, sizes) in SPLITS.items():
        shards, next_id = [], first
        for number, size in enumerate(sizes):
            path = root / f"{split}-{number:05d}-of-{len(sizes):05d}.tfrecord"
            with RecordWriter(str(path)) as writer:
                for _ in range(size):
                    writer.write(encode_example({"id": next_id, "tags": list(range(next_id % 4))}, kinds={"tags": "int64"}))
                    next_id += 1
            shards.append({"path": path.name, "num_examples": size, "num_bytes": path.stat().st_size})
        splits[split] = {"num_examples": sum(sizes), "num_bytes": 0, "shards": shards}
    manifest = {"format": "tfrbeam-dataset/1", "compression": None, "splits": splits,
                "features": {"id": {"type": "int64", "shape": [], "always_present": True},
                             "tags": {"type": "int64", "shape": None, "always_present": False}}}
    (root / "tfrbeam_dataset.json").write_text(json.dumps(manifest))
    return root


def ids(split: str) -> list[int]:
    first, sizes = SPLITS[split]
    return list(range(first, first + sum(sizes)))


def pair(root, batch_size=32, **options):
    """The two splits opened alike (shuffled within each by its own seed)."""
    shuffled = {"shuffle_files": True, "shuffle_buffer": 64}
    return [open_dataset(root, split="big", batch_size=batch_size, seed=1, **shuffled, **options),
            open_dataset(root, split="small", batch_size=batch_size, seed=2, **shuffled, **options)]


def mixed_ids(mixed) -> list[list[int]]:
    return [batch["id"].tolist() for batch in mixed]


def test_every_record_once_in_each_datasets_own_order_at_the_weights(dataset_dir):
    big, small = pair(dataset_dir)
    own_order = {"big": [i for b in big for i in b["id"].tolist()], "small": [i for b in small for i in b["id"].tolist()]}
    mixed = tfrbeam.mix(pair(dataset_dir), weights=[0.7, 0.3], seed=0, batch_size=50)
    batches = mixed_ids(mixed)
    flat = [i for batch in batches for i in batch]
    assert sorted(flat) == ids("big") + ids("small")  # stop_on_empty_dataset=False: all of both, none twice
    assert [i for i in flat if i < 5000] == own_order["big"] and [i for i in flat if i >= 5000] == own_order["small"]
    assert [len(batch) for batch in batches] == [50] * 22
    assert len(mixed) == 22
    # While both run, records come at the weights: of the first 300, small's share is 0.3 within 4 sigma (0.026).
    share = np.mean(np.array(flat[:300]) >= 5000)
    assert abs(share - 0.3) < 4 * np.sqrt(0.3 * 0.7 / 300)
    # Once small ran out (about record 333), big fills the batches.
    assert max(index for index, value in enumerate(flat) if value >= 5000) < 450


def test_the_same_seed_gives_the_same_batches_another_seed_others(dataset_dir):
    runs = [mixed_ids(tfrbeam.mix(pair(dataset_dir), [0.5, 0.5], seed=seed)) for seed in (7, 7, 8)]
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


def test_stop_on_empty_dataset_ends_at_the_first_draw_from_an_exhausted_one(dataset_dir):
    mixed = tfrbeam.mix(pair(dataset_dir), [0.5, 0.5], seed=4, stop_on_empty_dataset=True, batch_size=40)
    batches = mixed_ids(mixed)
    flat = [i for batch in batches for i in batch]
    big_seen = [i for i in flat if i < 5000]
    assert sorted(i for i in flat if i >= 5000) == ids("small")  # small ran out: that ended the pass
    assert 60 < len(big_seen) < 140  # about as many of big as of small, by the equal weights; not all 1,000
    assert len(big_seen) == len(set(big_seen))
    assert all(len(batch) == 40 for batch in batches[:-1])
    with pytest.raises(TypeError, match="depends on the draws"):
        len(mixed)


@given(stop_at=st.integers(0, 23), seed=st.integers(0, 2**31), stop_on_empty=st.booleans())
@settings(max_examples=12)
def test_a_mix_resumes_exactly_from_its_state_dict(dataset_dir, stop_at, seed, stop_on_empty):
    def opened():
        return tfrbeam.mix(pair(dataset_dir, batch_size=24), [0.6, 0.4], seed=seed, batch_size=45,
                           stop_on_empty_dataset=stop_on_empty)

    with opened() as whole:
        expected = mixed_ids(whole)
    with opened() as first:
        iterator = iter(first)
        head = [next(iterator)["id"].tolist() for _ in range(min(stop_at, len(expected)))]
        state = json.loads(json.dumps(first.state_dict()))  # a checkpoint survives JSON
    with opened() as resumed:
        resumed.load_state_dict(state)
        assert head + mixed_ids(resumed) == expected


def test_a_second_pass_starts_every_dataset_again(dataset_dir):
    mixed = tfrbeam.mix([open_dataset(dataset_dir, split="small", batch_size=16, seed=1, shuffle_buffer=32),
                         open_dataset(dataset_dir, split="big[:5%]", batch_size=16, seed=2)], seed=3)
    first, second = mixed_ids(mixed), mixed_ids(mixed)
    assert sorted(i for b in first for i in b) == sorted(i for b in second for i in b) == list(range(50)) + ids("small")
    assert first != second  # the new pass draws anew, and small's shuffle is its next epoch's


def test_arrow_and_padded_batches(dataset_dir):
    arrow = tfrbeam.mix(pair(dataset_dir, output="arrow"), seed=0, batch_size=100)
    batches = list(arrow)
    assert all(isinstance(batch, pa.RecordBatch) for batch in batches)
    table = pa.Table.from_batches(batches)
    assert sorted(table.column("id").to_pylist()) == ids("big") + ids("small")
    assert all(len(tags) == ident % 4 for ident, tags in zip(table.column("id").to_pylist(), table.column("tags").to_pylist()))
    padded = tfrbeam.mix(pair(dataset_dir, padded=True, return_mask=True), seed=0, batch_size=100)
    batch = next(iter(padded))
    assert batch["tags"].shape == (100, 3) and (batch["tags__mask"].sum(axis=1) == batch["id"] % 4).all()


def test_weights_zero_never_reads_that_dataset(dataset_dir):
    mixed = tfrbeam.mix(pair(dataset_dir), [1, 0], seed=0, batch_size=100)
    assert sorted(i for batch in mixed_ids(mixed) for i in batch) == ids("big")
    assert len(mixed) == 10


def test_mixes_that_cannot_be_are_refused_clearly(dataset_dir):
    big, small = pair(dataset_dir)
    with pytest.raises(ConfigError, match="2 numbers for 3 datasets"):
        tfrbeam.mix([big, small, big], [0.5, 0.5])
    with pytest.raises(ConfigError, match="none negative, and not all zero"):
        tfrbeam.mix([big, small], [1, -1])
    with pytest.raises(ConfigError, match="none negative, and not all zero"):
        tfrbeam.mix([big, small], [0, 0])
    only_id = open_dataset(dataset_dir, split="small", columns=["id"])
    with pytest.raises(ConfigError, match=r"dataset 1 has other features than dataset 0 \(differing: \['tags'\]\)"):
        tfrbeam.mix([big, only_id])
    arrow = open_dataset(dataset_dir, split="small", output="arrow")
    with pytest.raises(ConfigError, match="dataset 1 has output='arrow', dataset 0 'numpy'"):
        tfrbeam.mix([big, arrow])
    state = tfrbeam.mix([big, small], seed=1).state_dict()
    with pytest.raises(ConfigError, match="other seed, weights"):
        tfrbeam.mix([big, small], [2, 1], seed=2).load_state_dict(state)
