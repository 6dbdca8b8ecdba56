"""``mix``: records of several datasets (or splits) drawn at given weights into one stream of batches, resumable.

As tf.data's ``sample_from_datasets`` and Grain's ``mix``, each record of a batch comes from dataset ``i`` with
probability ``weights[i]`` (normalised over the datasets still running). Batch ``k`` of pass ``p`` draws its
choices from a generator seeded by (seed, p, k) and takes each dataset's records in that dataset's own order, so a
batch is a function of the seed and of where every dataset stood: ``state_dict`` saves exactly that (each
dataset's position before its batch in hand, and how many of that batch's records were used).
"""

from __future__ import annotations

import dataclasses
import math
import secrets
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from tfrbeam.dataset.columns import Block, block_rows, concat_blocks, slice_block, take_block
from tfrbeam.dataset.options import COLUMNS_OUTPUT
from tfrbeam.dataset.output import to_arrow, to_numpy
from tfrbeam.dataset.pipeline import Dataset
from tfrbeam.errors import ConfigError

MIX_STATE_VERSION = 1
# Options a mix takes from its first dataset, which every other must share (the batches' form).
SHARED_OPTIONS = ("output", "padded", "pad_values", "return_mask")


def mix(datasets: Sequence[Dataset], weights: Sequence[float] | None = None, *, seed: int | None = None,
        batch_size: int | None = None, drop_remainder: bool | None = None,
        stop_on_empty_dataset: bool = False) -> MixedDataset:
    """Batches whose records come from ``datasets`` at ``weights`` (default: equal), drawn by ``seed``.

    The datasets must have the same features (pass ``columns=`` to open the ones they share) and the same output
    form (``output``, ``padded``...); each keeps its own order, shuffle, slicing and ``repeat``. A pass ends when
    every dataset is exhausted (``stop_on_empty_dataset=False``, tf.data's default: once one runs out the others
    fill the batches, so the tail leaves the weights), or as soon as a record is drawn from an exhausted one
    (``True``: the weights hold throughout; Grain's ``mix`` stops so too). ``batch_size`` and ``drop_remainder``
    default to the first dataset's.
    """
    return MixedDataset(datasets, weights, seed, batch_size, drop_remainder, stop_on_empty_dataset)


@dataclasses.dataclass
class _Stream:
    """One dataset of a mix in a pass: its iterator, the batch in hand and how many of its records were used."""

    dataset: Dataset
    iterator: Iterator[Any] | None = None
    block: Block | None = None
    used: int = 0
    saved: dict[str, Any] | None = None  # the dataset's position before the batch in hand
    exhausted: bool = False

    def start(self, saved: Mapping[str, Any] | None, used: int) -> None:
        """Begin a pass of the dataset (from ``saved``, then ``used`` records into its next batch, when resuming)."""
        if saved is not None:
            self.dataset.load_state_dict(saved)
        self.iterator = iter(self.dataset)  # a new pass moves the dataset on to its next epoch: saved after it
        self.saved = self._position()
        self.block, self.used = None, 0
        if saved is not None and self._fetch():
            self.used = used

    def _position(self) -> dict[str, Any] | None:
        return self.dataset.state_dict() if self.dataset.options.deterministic else None

    def _fetch(self) -> bool:
        """The dataset's next batch into hand; False (and exhausted) at the end of its pass."""
        assert self.iterator is not None
        self.saved = self._position()
        try:
            self.block = next(self.iterator)
        except StopIteration:
            self.block, self.exhausted = None, True
            return False
        self.used = 0
        return True

    def take(self, count: int) -> list[Block]:
        """Up to ``count`` of the dataset's next records (fewer when it runs out), as pieces of its batches."""
        pieces: list[Block] = []
        while count and not self.exhausted:
            if self.block is None or self.used == block_rows(self.block):
                if not self._fetch():
                    break
                continue
            assert self.block is not None
            end = min(self.used + count, block_rows(self.block))
            pieces.append(slice_block(self.block, self.used, end))
            count -= end - self.used
            self.used = end
        return pieces

    def state(self) -> dict[str, Any] | None:
        if self.exhausted:
            return None
        if self.saved is None:
            raise ConfigError("state_dict() of a mix needs every dataset opened with deterministic=True")
        return {"dataset": self.saved, "used": self.used if self.block is not None else 0}

    def close(self) -> None:
        self.dataset.close()


class MixedDataset:
    """Batches mixed from several datasets; iterate it for one pass, ``state_dict``/``load_state_dict`` to resume."""

    def __init__(self, datasets: Sequence[Dataset], weights: Sequence[float] | None, seed: int | None,
                 batch_size: int | None, drop_remainder: bool | None, stop_on_empty_dataset: bool):
        if not datasets:
            raise ConfigError("mix needs at least one dataset")
        self.weights = _checked_weights(weights, len(datasets))
        _check_alike(datasets)
        first = datasets[0]
        self.features = dict(first.features)
        self.options = first.options
        self.batch_size = first.options.batch_size if batch_size is None else batch_size
        if self.batch_size < 1:
            raise ConfigError(f"mix batch_size must be at least 1, got {self.batch_size}")
        self.drop_remainder = first.options.drop_remainder if drop_remainder is None else drop_remainder
        self.stop_on_empty_dataset = stop_on_empty_dataset
        self.seed = secrets.randbits(63) if seed is None else int(seed)
        # Our own copies, handing out columns: the mix cuts batches across datasets, then converts once.
        self._streams = [_Stream(dataset._derive(options=dataclasses.replace(dataset.options, output=COLUMNS_OUTPUT)))
                         for dataset in datasets]
        self._pass = -1
        self._batch = 0
        self._done = False  # the pass has handed out its last batch
        self._ended = False  # ... and its iterator has stopped: the next one begins a new pass
        self._pending: Mapping[str, Any] | None = None

    def __repr__(self) -> str:
        return (f"MixedDataset({len(self._streams)} datasets, weights={self.weights.tolist()}, batch_size={self.batch_size}, "
                f"seed={self.seed}, stop_on_empty_dataset={self.stop_on_empty_dataset})")

    def __len__(self) -> int:
        """Batches per pass: known only when no dataset stops the pass early (stop_on_empty_dataset=False)."""
        drawn = [stream.dataset for stream, weight in zip(self._streams, self.weights) if weight]
        total = 0
        for dataset in drawn:
            records, epochs = dataset.num_records, dataset._epochs
            if self.stop_on_empty_dataset or records is None or dataset._limit is not None:
                raise TypeError("the number of batches of this mix is unknown: with stop_on_empty_dataset=True it "
                                "depends on the draws, and a dataset without a manifest (or cut by take) has no known size")
            if epochs is None:
                raise TypeError("a dataset of this mix repeats forever")
            total += records * epochs
        return total // self.batch_size if self.drop_remainder else math.ceil(total / self.batch_size)

    # ------------------------------------------------------------------ position

    def _arguments(self) -> dict[str, Any]:
        return {"weights": self.weights.tolist(), "batch_size": self.batch_size, "drop_remainder": self.drop_remainder,
                "stop_on_empty_dataset": self.stop_on_empty_dataset, "datasets": len(self._streams)}

    def state_dict(self) -> dict[str, Any]:
        """The position after the last batch handed out: pass it to ``load_state_dict`` to continue there."""
        started = self._pass >= 0  # before the first pass, every dataset is where it was opened
        return {"version": MIX_STATE_VERSION, "seed": self.seed, "arguments": self._arguments(), "pass": self._pass,
                "batch": self._batch, "done": self._done, "ended": self._ended or not started,
                "datasets": [stream.state() if started else None for stream in self._streams]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a position saved by ``state_dict`` of a mix of the same datasets, weights and seed."""
        if state.get("version") != MIX_STATE_VERSION:
            raise ConfigError(f"mix state version {state.get('version')!r} is not {MIX_STATE_VERSION}")
        saved, ours = state.get("arguments") or {}, self._arguments()
        differing = [key for key in ours if saved.get(key) != ours[key]]
        if state.get("seed") != self.seed:
            differing.insert(0, "seed")
        if differing:
            raise ConfigError(f"this mix state was saved by a mix with other {', '.join(differing)} (saved {saved}, seed "
                              f"{state.get('seed')}; this mix's {ours}, seed {self.seed}); mix with the same arguments")
        self._pending = state

    # ------------------------------------------------------------------ iteration

    def __iter__(self) -> Iterator[Any]:
        self._begin_pass()
        return self._batches()

    def _begin_pass(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None and not pending["ended"]:
            self._pass, self._batch, self._done = int(pending["pass"]), int(pending["batch"]), bool(pending["done"])
            for stream, saved in zip(self._streams, pending["datasets"]):
                stream.exhausted = saved is None
                if saved is not None and not self._done:
                    stream.start(saved["dataset"], int(saved["used"]))
            return
        if pending is not None:
            self._pass = int(pending["pass"])
        self._pass, self._batch, self._done, self._ended = self._pass + 1, 0, False, False
        for stream in self._streams:
            stream.exhausted = False
            stream.start(None, 0)

    def _batches(self) -> Iterator[Any]:
        while not self._done:
            block = self._next_block()
            if block is None or (self.drop_remainder and block_rows(block) < self.batch_size):
                self._done = True
                break
            self._batch += 1
            yield self._convert(block)
        for stream in self._streams:
            stream.exhausted = True
        self._ended = True

    def _next_block(self) -> Block | None:
        """Batch ``self._batch``: each place drawn among the live datasets, each dataset's records in its order."""
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([self.seed, self._pass, self._batch])))
        owners = np.full(self.batch_size, -1, dtype=np.int64)
        pieces: dict[int, list[Block]] = {}
        open_places = np.arange(self.batch_size)
        while open_places.size:
            live = [number for number, stream in enumerate(self._streams) if not stream.exhausted and self.weights[number]]
            if not live:
                break
            chances = self.weights[live] / self.weights[live].sum()
            drawn = np.asarray(live)[rng.choice(len(live), size=open_places.size, p=chances)]
            short: list[np.ndarray] = []
            for number in live:
                places = open_places[drawn == number]
                got = self._streams[number].take(len(places))
                pieces.setdefault(number, []).extend(got)
                filled = sum(block_rows(piece) for piece in got)
                owners[places[:filled]] = number
                short.append(places[filled:])
            open_places = np.sort(np.concatenate(short))
            if open_places.size and self.stop_on_empty_dataset:
                owners[open_places[0]:] = -1  # the pass ends at the first record drawn from an exhausted dataset
                self._done = True
                break
        # Places left open once every dataset ran out are dropped; the records of later places are kept.
        return self._assemble(owners[owners >= 0], pieces)

    def _assemble(self, owners: np.ndarray, pieces: Mapping[int, list[Block]]) -> Block | None:
        """The batch's rows in place order: ``owners[i]`` is the dataset of place i."""
        if not owners.size:
            return None
        blocks, rows = [], []
        for number in sorted(set(owners.tolist())):
            places = np.flatnonzero(owners == number)
            block = concat_blocks(pieces[number])
            blocks.append(slice_block(block, 0, len(places)))
            rows.append(places)
        order = np.argsort(np.concatenate(rows), kind="stable")
        return take_block(concat_blocks(blocks), order)

    def _convert(self, block: Block) -> Any:
        if self.options.output == "arrow":
            return to_arrow(block, self.features)
        return to_numpy(block, self.features, self.options.padded, self.options.pad_values, self.options.return_mask)

    def close(self) -> None:
        """Stop every dataset's readers."""
        for stream in self._streams:
            stream.close()

    def __enter__(self) -> MixedDataset:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _checked_weights(weights: Sequence[float] | None, count: int) -> np.ndarray:
    values = np.ones(count) if weights is None else np.asarray(weights, dtype=np.float64).reshape(-1)
    if len(values) != count:
        raise ConfigError(f"mix weights {list(values)} are {len(values)} numbers for {count} datasets; give one per dataset")
    if not np.all(np.isfinite(values)) or (values < 0).any() or values.sum() <= 0:
        raise ConfigError(f"mix weights {values.tolist()} must be finite, none negative, and not all zero")
    return values


def _check_alike(datasets: Sequence[Dataset]) -> None:
    """Every dataset has the first one's features and batch form: their records go into the same batches."""
    first = datasets[0]
    for number, dataset in enumerate(datasets[1:], start=1):
        if dataset.features != first.features:
            names = sorted(set(dataset.features) ^ set(first.features)) or sorted(
                name for name in first.features if dataset.features[name] != first.features[name])
            raise ConfigError(f"mix: dataset {number} has other features than dataset 0 (differing: {names}); open "
                              "them with the same columns= (and feature_spec=) to mix their records")
        for name in SHARED_OPTIONS:
            if getattr(dataset.options, name) != getattr(first.options, name):
                raise ConfigError(f"mix: dataset {number} has {name}={getattr(dataset.options, name)!r}, dataset 0 "
                                  f"{getattr(first.options, name)!r}; open them with the same {name}")
