"""Feature specs and the vectorised conversion of input Arrow batches into feature columns (no Beam).

A FeatureSpec says how one tf.train.Example feature is made from one input column; convert_batch
applies a tuple of specs to a RecordBatch and separates the rows that cannot be converted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

FEATURE_TYPES = ("int64", "float", "bytes")
ON_NULL_ACTIONS = ("omit", "default", "error")


@dataclass(frozen=True)
class FeatureSpec:
    """One output feature: its Example type, the input column it comes from and how nulls are handled.

    type is None only before inference (a feature listed without a type); separator splits a CSV
    string into a list; length fixes the list length (a different count is a bad row); is_list is
    true for separator features and for list-typed source columns (set when resolved on a schema).
    """

    name: str
    type: str | None
    source: str
    on_null: str = "error"
    default: Any = None
    separator: str | None = None
    length: int | None = None
    is_list: bool = False

    @property
    def shape(self) -> tuple[int, ...] | None:
        """() for a scalar, (length,) for a fixed-length list, None for a variable-length list."""
        if not self.is_list:
            return ()
        return (self.length,) if self.length is not None else None

    @property
    def always_present(self) -> bool:
        """False when a row may lack the feature (a null with on_null: omit)."""
        return self.on_null != "omit"
