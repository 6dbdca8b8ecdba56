"""How counts read in messages: ``1 shard``, ``2 shards``, never ``1 shards`` or ``file(s)``."""

from __future__ import annotations


def counted(count: int, noun: str, plural: str | None = None, *, grouped: bool = False) -> str:
    """``count`` and ``noun``, the noun plural unless the count is 1 (``plural`` when adding "s" is wrong).

    ``grouped`` writes the count with thousands separators (``12,345 rows``), as the build's summary does.
    """
    number = f"{count:,}" if grouped else str(count)
    return f"{number} {noun if count == 1 else plural or noun + 's'}"
