"""``Options``: the settings of ``open_dataset`` that shape a dataset's batches, fixed when it is opened.

Its own module so the epoch (``epoch.py``) and the pass (``passes.py``) can read them without
importing the ``Dataset`` (``pipeline.py``) that builds on both.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from tfrbeam.codec.decode import DEFAULT_MAX_FEATURES

# An internal output: batches stay columns (unpacked blocks), for ``tfrbeam.mix`` to cut and convert.
COLUMNS_OUTPUT = "columns"


@dataclasses.dataclass(frozen=True)
class Options:
    """Everything that shapes the batches (and, for the fields in ``order_fields``, their order)."""

    batch_size: int
    output: str
    cycle_length: int
    block_length: int
    shuffle_files: bool
    shuffle_buffer: int
    seed: int
    drop_remainder: bool
    prefetch: int
    autotune: bool
    deterministic: bool
    skip_corrupt: bool
    padded: Mapping[str, int | None]
    executor: str
    num_workers: int
    raw: bool = False
    max_features: int | None = DEFAULT_MAX_FEATURES
    pad_values: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    return_mask: bool = False

    order_fields = ("batch_size", "cycle_length", "block_length", "shuffle_files", "shuffle_buffer", "seed", "drop_remainder")
