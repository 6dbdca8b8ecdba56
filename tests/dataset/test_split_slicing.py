"""Split strings (TFDS's ``train[:10%]``, ``train[1000:2000]``, ``train+eval``) and ``even_splits`` in the reader.

The oracle of the percent boundaries is TFDS's documented rule (``rounding="closest"``, tensorflow.org/datasets/splits
and ``tensorflow_datasets/core/splits.py``), written here from that rule: no TensorFlow or TFDS import.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tfrbeam
from tfrbeam.codec.example import encode_example
from tfrbeam.dataset import open_dataset, open_random_access
from tfrbeam.dataset.splits import even_splits, record_ranges
from tfrbeam.errors import ConfigError
from tfrbeam.tfrecord.records import RecordWriter

SIZES = {"train": [70, 0, 95, 35], "eval": [13, 8]}  # an empty shard in the middle
FIRST_ID = {"train": 0, "eval": 1000}


def build(root: pathlib.Path) -> pathlib.Path:
    """A build directory with splits train and eval (ids consecutive in manifest order) and its manifest."""
    root.mkdir(parents=True, exist_ok=True)
    splits = {}
    for split, sizes in SIZES.items():
        shards, next_id = [], FIRST_ID[split]
        for number, size in enumerate(sizes):
            path = root / f"{split}-{number:05d}-of-{len(sizes):05d}.tfrecord"
            with RecordWriter(str(path)) as writer:
                for _ in range(size):
                    writer.write(encode_example({"id": next_id}))
                    next_id += 1
            shards.append({"path": path.name, "num_examples": size, "num_bytes": path.stat().st_size})
        splits[split] = {"num_examples": sum(sizes), "num_bytes": 0, "shards": shards}
    manifest = {"format": "tfrbeam-dataset/1", "compression": None, "splits": splits,
                "features": {"id": {"type": "int64", "shape": [], "always_present": True}}}
    (root / "tfrbeam_dataset.json").write_text(json.dumps(manifest))
    return root


@pytest.fixture(scope="module")
def dataset_dir(tmp_path_factory) -> pathlib.Path:
    return build(tmp_path_factory.mktemp("splits") / "ds")


def whole(split: str) -> list[int]:
    return list(range(FIRST_ID[split], FIRST_ID[split] + sum(SIZES[split])))


def ids_of(ranges) -> list[int]:
    """The record ids (as ``build`` numbers them) of ``record_ranges`` output."""
    out = []
    for piece in ranges:
        base = FIRST_ID[piece.split] + sum(SIZES[piece.split][:piece.shard])
        out += range(base + piece.start, base + piece.stop)
    return out


def read_ids(dataset_dir: pathlib.Path, split: str, **options) -> list[int]:
    with open_dataset(dataset_dir, split=split, columns=["id"], batch_size=16, **options) as dataset:
        return [int(value) for batch in dataset for value in batch["id"]]


# ---------------------------------------------------------------------------------------- TFDS's rounding


def tfds_closest(boundary: int, total: int) -> int:
    """TFDS's ``_pct_to_abs_closest``: the percent boundary as a record count, by Python's float round (half to even)."""
    return int(round(boundary * total / 100.0))


def tfds_file_instructions(start_pct: int | None, stop_pct: int | None, lengths: list[int]) -> list[tuple[int, int, int]]:
    """(shard, skip, take) TFDS reads for ``split[start%:stop%]``: negative percents count from the end, empty shards
    are passed over (TFDS ``splits._rel_to_abs_instr`` and ``shard_utils.get_file_instructions``)."""
    total = sum(lengths)
    start = 0 if start_pct is None else tfds_closest(start_pct, total)
    stop = total if stop_pct is None else tfds_closest(stop_pct, total)
    start, stop = (start + total if start < 0 else start), (stop + total if stop < 0 else stop)
    out, begin = [], 0
    for shard, length in enumerate(lengths):
        end = begin + length
        if length and start < end and stop > begin:
            skip = max(start - begin, 0)
            take = stop - begin - skip if stop < end else length - skip
            if take:
                out.append((shard, skip, take))
        begin = end
    return out


def pct(value: int | None) -> str:
    return "" if value is None else f"{value}%"


@given(lengths=st.lists(st.integers(0, 400), min_size=1, max_size=6).filter(lambda sizes: sum(sizes) > 0),
       bounds=st.tuples(st.one_of(st.none(), st.integers(-100, 100)), st.one_of(st.none(), st.integers(-100, 100))))
@settings(max_examples=400)
def test_percent_slices_read_the_records_tfds_would(lengths, bounds):
    start, stop = bounds
    total = sum(lengths)
    resolved = [0 if start is None else tfds_closest(start, total), total if stop is None else tfds_closest(stop, total)]
    resolved = [value + total if value < 0 else value for value in resolved]
    text = "train" if bounds == (None, None) else f"train[{pct(start)}:{pct(stop)}]"  # TFDS refuses "train[:]" too
    if resolved[0] > resolved[1]:  # TFDS reads a negative take as "all"; we refuse a slice that ends before it starts
        with pytest.raises(ConfigError, match="after its stop"):
            record_ranges(text, {"train": lengths})
        return
    ours = [(piece.shard, piece.start, piece.stop - piece.start) for piece in record_ranges(text, {"train": lengths})]
    assert ours == tfds_file_instructions(start, stop, lengths)


def test_percent_rounding_ties_go_to_even_as_in_tfds():
    # 10% of 5 records is 0.5 -> 0, 30% is 1.5 -> 2, 50% is 2.5 -> 2 (Python's round), so [:10%] is empty.
    assert record_ranges("train[:10%]", {"train": [5]}) == ()
    assert [(p.start, p.stop) for p in record_ranges("train[10%:30%]", {"train": [5]})] == [(0, 2)]
    assert [(p.start, p.stop) for p in record_ranges("train[30%:50%]", {"train": [5]})] == []
    # TFDS's demo figure: 271 of the demo build's 2,714 train records in train[:10%].
    assert sum(p.stop - p.start for p in record_ranges("train[:10%]", {"train": [1357, 1357]})) == 271


# ---------------------------------------------------------------------------------------- exact partitions


@st.composite
def cut_split(draw):
    """Shard lengths and sorted cut points (percents or record numbers) dividing the split."""
    lengths = draw(st.lists(st.integers(0, 300), min_size=1, max_size=6).filter(lambda sizes: sum(sizes) > 0))
    unit = draw(st.sampled_from(["%", ""]))
    top = 100 if unit else sum(lengths)
    cuts = sorted(draw(st.lists(st.integers(0, top), max_size=5)))
    return lengths, unit, cuts


def slice_strings(unit: str, cuts: list[int]) -> list[str]:
    edges = [""] + [f"{cut}{unit}" for cut in cuts] + [""]
    return [f"train[{low}:{high}]" if low or high else "train" for low, high in zip(edges[:-1], edges[1:])]


def partition_ids(lengths: list[int], text: str) -> list[int]:
    """Split-wide record numbers of ``text`` over a split ``train`` of shards ``lengths``."""
    bases = np.concatenate(([0], np.cumsum(lengths))).tolist()
    return [record for piece in record_ranges(text, {"train": lengths})
            for record in range(bases[piece.shard] + piece.start, bases[piece.shard] + piece.stop)]


@given(cut_split())
@settings(max_examples=300)
def test_slices_at_any_cuts_partition_the_split(case):
    lengths, unit, cuts = case
    records = [record for text in slice_strings(unit, cuts) for record in partition_ids(lengths, text)]
    assert records == list(range(sum(lengths)))


@given(lengths=st.lists(st.integers(0, 300), min_size=1, max_size=6).filter(lambda sizes: sum(sizes) > 0),
       hosts=st.integers(1, 40), drop_remainder=st.booleans(), base=st.sampled_from(["train", "train[10%:90%]", "train[-77:]"]))
@settings(max_examples=300)
def test_even_splits_partition_the_split_for_any_host_count(lengths, hosts, drop_remainder, base):
    total = sum(lengths)
    if base == "train[-77:]" and total < 77:
        base = "train[3:]" if total >= 3 else "train"
    parts = [partition_ids(lengths, text) for text in even_splits(base, hosts, drop_remainder=drop_remainder)]
    everything = partition_ids(lengths, base)
    joined = [record for part in parts for record in part]
    sizes = {len(part) for part in parts}
    if drop_remainder:
        assert sizes == {len(everything) // hosts}
        assert joined == everything[:len(joined)] and len(everything) - len(joined) == len(everything) % hosts
    else:
        assert joined == everything  # in order: no record twice, none lost
        assert max(sizes) - min(sizes) <= 1
        assert [len(part) for part in parts] == sorted((len(part) for part in parts), reverse=True)


def test_even_splits_of_a_sum_cut_each_term_as_tfds_does():
    lengths = {"train": [10, 11], "eval": [4]}
    parts = even_splits("train[:50%]+eval", 3)
    assert parts == ["train[:50%]{0/3}+eval{0/3}", "train[:50%]{1/3}+eval{1/3}", "train[:50%]{2/3}+eval{2/3}"]
    # train[:50%] is records 0..10 (10.5 rounds to 10): parts of 4, 3, 3; eval's 4 records: 2, 1, 1.
    sizes = [[(p.split, p.stop - p.start) for p in record_ranges(text, lengths)] for text in parts]
    assert sizes == [[("train", 4), ("eval", 2)], [("train", 3), ("eval", 1)], [("train", 3), ("eval", 1)]]
    # even_splits of an even part cuts it again, as tfds.even_splits of its own output does
    assert [len(partition_ids([10, 11], text)) for text in even_splits(even_splits("train", 2)[1], 2)] == [5, 5]


# ---------------------------------------------------------------------------------------- the reader


@given(cuts=st.lists(st.integers(0, 100), max_size=4), hosts=st.integers(1, 9), seed=st.integers(0, 2**32))
@settings(max_examples=25)
def test_slices_and_host_parts_read_every_record_once(dataset_dir, cuts, hosts, seed):
    """Read through open_random_access (in order) and open_dataset (shuffled by the seed), against the split read whole."""
    texts = slice_strings("%", sorted(cuts))
    everything = whole("train")
    assert read_ids(dataset_dir, "train") == everything
    in_order = [int(open_random_access(dataset_dir, text, columns=["id"])[index]["id"])
                for text in texts for index in range(len(open_random_access(dataset_dir, text)))]
    assert in_order == everything
    host = seed % hosts
    part = even_splits(texts[-1], hosts)[host]
    shuffled = read_ids(dataset_dir, part, shuffle_files=True, shuffle_buffer=64, seed=seed)
    expected = ids_of(record_ranges(part, SIZES))
    assert sorted(shuffled) == expected
    assert len(open_dataset(dataset_dir, split=part, batch_size=16)) == -(-len(expected) // 16)


def test_split_strings_in_both_readers(dataset_dir):
    assert read_ids(dataset_dir, "train[100:150]") == list(range(100, 150))
    assert read_ids(dataset_dir, "train[-100:]") == list(range(100, 200))
    assert read_ids(dataset_dir, "train[:10%]+eval") == list(range(20)) + whole("eval")
    assert read_ids(dataset_dir, "eval + train[10%:12%]") == whole("eval") + [20, 21, 22, 23]
    assert read_ids(dataset_dir, "all") == whole("train") + whole("eval")
    assert read_ids(dataset_dir, "train[2shard]") == list(range(70, 165))
    source = open_random_access(dataset_dir, "train[60:80]+eval[:2]", columns=["id"])
    assert len(source) == 22
    assert [int(row["id"]) for row in source[::7]] == [60, 67, 74, 1001]
    assert int(source[-1]["id"]) == 1001 and int(source.__getitems__([21, 0, 10])[1]["id"]) == 60


def test_a_slice_reads_only_the_shards_it_needs(tmp_path):
    root = build(tmp_path / "ds")
    (root / "train-00003-of-00004.tfrecord").unlink()  # train[:50%] never touches the last shard
    dataset = open_dataset(root, split="train[:50%]", columns=["id"], batch_size=16)
    assert [(pathlib.Path(s.path).name, s.start, s.stop) for s in dataset.segments] == [
        ("train-00000-of-00004.tfrecord", 0, None), ("train-00002-of-00004.tfrecord", 0, 30)]
    assert [int(value) for batch in dataset for value in batch["id"]] == list(range(100))
    assert len(open_random_access(root, "train[10%:50%]")) == 80
    assert int(open_random_access(root, "train[10%:50%]", columns=["id"])[-1]["id"]) == 99


def test_a_slice_resumes_from_its_state_dict(dataset_dir):
    options = {"split": "train[25%:]+eval[:5]", "columns": ["id"], "batch_size": 8, "shuffle_files": True,
               "shuffle_buffer": 32, "seed": 3}
    first = open_dataset(dataset_dir, **options)
    iterator = iter(first)
    head = [int(value) for _ in range(5) for value in next(iterator)["id"]]
    state = first.state_dict()
    first.close()
    resumed = open_dataset(dataset_dir, **options)
    resumed.load_state_dict(state)
    rest = [int(value) for batch in resumed for value in batch["id"]]
    assert sorted(head + rest) == list(range(50, 200)) + [1000, 1001, 1002, 1003, 1004]
    other = open_dataset(dataset_dir, **{**options, "split": "train[26%:]+eval[:5]"})
    with pytest.raises(ConfigError, match="other files"):
        other.load_state_dict(state)


@pytest.mark.parametrize(("text", "problem"), [
    ("train[5]", "is one index"),
    ("train[:150%]", "percent outside"),
    ("train[1:2:3]", "not a slice"),
    ("train[300:]", "outside split 'train', which has 200 records"),
    ("train[50:10]", "after its stop"),
    ("train[a:b]", "not a slice"),
    ("train[10%:20shard]", "mixes units"),
    ("all[:10%]", "'all' cannot be sliced"),
    ("tra in", "is not a split name"),
    ("train{4/4}", "part index 4"),
    ("test", "has no split 'test'; it has ['eval', 'train']"),
])
def test_a_bad_split_string_is_one_line_naming_it(dataset_dir, text, problem):
    for opener in (lambda: open_dataset(dataset_dir, split=text), lambda: open_random_access(dataset_dir, text)):
        with pytest.raises(ConfigError) as caught:
            opener()
        message = str(caught.value)
        assert "\n" not in message and repr(text) in message and problem in message
        if text != "test":
            assert "valid forms: 'train', 'train[:10%]'" in message


def test_even_splits_is_exported_and_checks_its_arguments():
    assert tfrbeam.even_splits("train", 2, drop_remainder=True) == ["train{0/2,drop_remainder}", "train{1/2,drop_remainder}"]
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ConfigError, match="at least 1"):
            tfrbeam.even_splits("train", bad)
    with pytest.raises(ConfigError, match="not a slice"):
        tfrbeam.even_splits("train[x]", 2)
