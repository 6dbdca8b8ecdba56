"""The spilling store's shared part (tfrbeam.builder.shuffle.held): the run-keyed registry, the budget, the spill."""

from __future__ import annotations

import threading

import pytest

from tfrbeam.builder.shuffle import held
from tfrbeam.errors import HeldDataMissingError, ShuffledDataError


class _Items(held.Holding[str]):
    def __init__(self) -> None:
        super().__init__()
        self.items: dict[str, bytes] = {}
        self.freed: list[str] = []

    def discarded(self) -> None:
        super().discarded()
        self.freed.extend(self.items)
        self.items.clear()


def _hold(holding: _Items, name: str, data: bytes, budget: int | None) -> bool:
    with holding.lock:
        fits = holding.reserve(len(data), budget, always=True)
        holding.items[name] = data
        holding.keep(name, len(data))
    return fits


def test_each_kind_of_a_run_is_held_apart_and_discard_held_frees_every_kind():
    pieces, rows = held.HeldRuns("test-pieces", _Items), held.HeldRuns("test-rows", _Items)
    first, other = pieces.open("run-a"), rows.open("run-a")
    assert first is not other and pieces.open("run-a") is first and rows.get("run-b") is None
    _hold(first, "x", b"123", None)
    rows.open("run-b")
    assert held.runs_holding() == ["run-a", "run-b"] and pieces.runs() == ["run-a"]
    held.discard_held("run-a")  # a failed run: both kinds go, each frees what it kept
    assert first.ended and first.freed == ["x"] and first.in_memory == 0 and other.ended
    assert held.runs_holding() == ["run-b"]
    with pytest.raises(HeldDataMissingError, match="the pieces of the run staging in run-a is not held in this process"):
        pieces.require("run-a", "the pieces")
    rows.end("run-b", held.Holding(), if_empty=lambda: True)  # another holding: not this run's, nothing happens
    assert held.runs_holding() == ["run-b"]
    rows.end("run-b", rows.get("run-b"), if_empty=lambda: False)  # not empty (any more): it stays
    assert held.runs_holding() == ["run-b"]
    rows.end("run-b")
    assert held.runs_holding() == []


def test_the_budget_counts_what_is_held_and_gets_back_what_is_freed():
    holding = _Items()
    assert holding.reserve(60, 100) and not holding.reserve(50, 100) and holding.in_memory == 60  # refused: not counted
    assert not holding.reserve(50, 100, always=True) and holding.in_memory == 110  # counted anyway: it is in memory
    holding.keep("a", 60)
    holding.free("a")
    holding.free("a")  # freed twice: counted once
    assert holding.in_memory == 50 and holding.reserve(10**12, None)


def test_a_spill_takes_what_is_held_once_and_a_failed_write_leaves_it_held():
    holding = _Items()
    for name in "abc":
        _hold(holding, name, name.encode() * 10, 25)
    writing, other_tried = threading.Event(), threading.Event()
    runs: list[list[bytes]] = []

    def write(members: list[bytes]) -> str:
        writing.set()
        assert other_tried.wait(10)  # another thread looks for something to spill meanwhile
        runs.append(members)
        return "run-file"

    def placed(names: list[str], where: str) -> None:
        for name in names:
            holding.free(name)
            del holding.items[name]

    def gather(names: list[str]) -> list[bytes]:
        return [holding.items[name] for name in names]

    results: list[bool] = []
    spiller = threading.Thread(target=lambda: results.append(holding.spill(gather, write, placed)))
    spiller.start()
    assert writing.wait(10)
    results.append(holding.spill(gather, write, placed))  # everything held is being written: nothing to take
    other_tried.set()
    spiller.join(10)
    assert sorted(results) == [False, True] and runs == [[b"a" * 10, b"b" * 10, b"c" * 10]]
    assert holding.in_memory == 0 and holding.spilling == set()

    _hold(holding, "d", b"d" * 10, 25)

    def full(members: list[bytes]) -> str:
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space"):
        holding.spill(gather, full, placed)
    assert holding.spilling == set() and holding.in_memory == 10  # still held: the next spill may take it
    other_tried.set()
    assert holding.spill(gather, write, placed) and runs[-1] == [b"d" * 10]


def test_spill_files_are_written_read_back_whole_and_deleted(tmp_path, caplog):
    path = held.spill_path(str(tmp_path), ".bin")
    assert path.startswith(str(tmp_path)) and path.endswith(".bin") and path != held.spill_path(str(tmp_path), ".bin")
    held.write_spill_file(path, (bytes([n]) * 1000 for n in range(5)), overlap=True)
    assert held.read_spilled(path, 1500, 1000, "things") == b"\x01" * 500 + b"\x02" * 500
    with pytest.raises(ShuffledDataError, match=r"things spilled there end 10 bytes early .*changed or damaged on disk"):
        held.read_spilled(path, 4010, 1000, "things")
    held.delete_spilled([path], "things")
    with pytest.raises(HeldDataMissingError, match="things spilled there cannot be read back"):
        held.read_spilled(path, 0, 10, "things")
    with caplog.at_level("WARNING"):
        held.delete_spilled([path], "things")  # gone already: a warning, not a failure
    assert "is already gone" in caplog.text


@pytest.mark.parametrize("damage", ["cut", "deleted"])
def test_a_spilled_piece_whose_file_is_cut_or_gone_is_one_error_naming_the_file(tmp_path, damage):
    """Read back through the one spill reader: a file cut short is damage on disk (ShuffledDataError), a file that is
    gone is data the run no longer has (HeldDataMissingError); each names the file, never a bare OSError."""
    import random

    from tests.builder.shuffle.test_shuffle import _dataset, _pieces
    from tfrbeam.builder.shuffle import SpillStore

    store = SpillStore(str(tmp_path / "spill"))
    (records,) = _pieces(_dataset(50, random.Random(3)), [50], [1.0], seed=1)
    piece = store.add(records)
    store.flush()
    store.close()
    path = tmp_path / "spill" / piece.ref.location.rsplit("/", 1)[-1]
    if damage == "cut":
        path.write_bytes(path.read_bytes()[:-7])
        expected, message = ShuffledDataError, rf"{path}: records spilled there end 7 bytes early .*changed or damaged"
    else:
        path.unlink()
        expected, message = HeldDataMissingError, rf"{path} \(bytes 0 to .*cannot be read back"
    with pytest.raises(expected, match=message):
        store.records(piece)
