"""PyTorch adapter: a ``torch.utils.data.IterableDataset`` over a tfrbeam ``Dataset`` (optional extra ``torch``).

    loader = DataLoader(TorchIterableDataset(open_dataset(path, batch_size=256, shuffle_buffer=10_000)), batch_size=None)

The tfrbeam dataset already batches, reads in parallel and prefetches, so use ``batch_size=None``
and ``num_workers=0`` (if DataLoader workers are used anyway, each reads its own shard).
Numeric arrays become tensors without a copy; bytes features stay numpy object arrays (torch has
no string tensor); ``Ragged`` features become ``Ragged(values_tensor, lengths_tensor)``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

try:
    import torch
    from torch.utils.data import IterableDataset, get_worker_info
except ImportError as exc:  # pragma: no cover - exercised only without torch
    raise ImportError("tfrbeam.dataset.torch needs PyTorch: pip install 'tfrbeam[torch]' (or pip install torch)") from exc

from tfrbeam.dataset.columns import Ragged
from tfrbeam.dataset.pipeline import Dataset


def to_torch(value: Any) -> Any:
    """numpy arrays (and Ragged of them) as tensors sharing memory; object arrays (bytes) unchanged."""
    if isinstance(value, Ragged):
        return Ragged(to_torch(value.values), to_torch(value.lengths))
    if isinstance(value, np.ndarray) and value.dtype != object:
        return torch.from_numpy(value)
    return value


class TorchIterableDataset(IterableDataset):
    """Batches of a tfrbeam ``Dataset`` as dicts of tensors; checkpointable through ``state_dict``."""

    def __init__(self, dataset: Dataset):
        super().__init__()
        self.dataset = dataset

    def _for_this_worker(self) -> Dataset:
        info = get_worker_info()
        if info is None or info.num_workers == 1:
            return self.dataset
        return self.dataset.shard(info.num_workers, info.id)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for batch in self._for_this_worker():
            yield {name: to_torch(value) for name, value in batch.items()}

    def __len__(self) -> int:
        return len(self.dataset)

    def state_dict(self) -> dict[str, Any]:
        return self.dataset.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.dataset.load_state_dict(state)
