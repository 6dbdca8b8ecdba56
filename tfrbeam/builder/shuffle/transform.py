"""The shuffle as Beam transforms: KeyedRecords in, shuffled, split, exactly balanced shard files out."""

from __future__ import annotations

import apache_beam as beam

from tfrbeam.builder.inputs.progress import progress_dir
from tfrbeam.builder.shuffle.balance import PlanShards, ShardingSpec
from tfrbeam.builder.shuffle.copies import TallyCopies
from tfrbeam.builder.shuffle.pieces import Piece
from tfrbeam.builder.shuffle.route import (
    GroupPieces,
    PreparePieces,
    RouteGroupedPieces,
    empty_shards_if_no_records,
    every_shard_key,
)
from tfrbeam.builder.shuffle.stores import InlineStore, PieceStore
from tfrbeam.builder.shuffle.write import WriteShard, WriteShardOfPieces

__all__ = ["WriteShardsFromPieceList", "WriteShardsThroughGroupByKey", "WriteShuffledShards"]


class WriteShardsOfPlan(beam.PTransform):
    """PCollection[Piece] -> PCollection[WrittenShard], one per shard of ``plan`` (a one-element PCollection[ShardPlan])."""

    def __init__(self, temp_dir: str, store: PieceStore, plan: beam.PCollection, progress: str | None = None,
                 tally: dict[str, beam.PCollection] | None = None):
        super().__init__()
        self._temp_dir, self._store, self._plan, self._progress = temp_dir, store, plan, progress
        self._tally = tally  # the tally of copies' outputs (``TallyCopies``), for shuffled builds

    def _moved_side(self) -> dict:
        """The moved copies as the routing takes them, if the build has a tally: by piece name (a multimap, asked only
        for the pieces named in the list of those that have some)."""
        if self._tally is None:
            return {}
        return {"moved": beam.pvalue.AsMultiMap(self._tally["moved"]), "movers": beam.pvalue.AsList(self._tally["movers"])}


class WriteShardsFromPieceList(WriteShardsOfPlan):
    """Shard writers that take every piece as a side input and route them themselves: no routing stage, no GroupByKey.

    For stores whose pieces carry no bytes and whose workers all share this process (``MemoryStore``):
    on the local runners the GroupByKey and the routing stage would each cost a whole stage.
    """

    def expand(self, pieces):
        writer = WriteShardOfPieces(self._temp_dir, self._store, self._progress)
        return (
            self._plan
            | "EveryShard" >> beam.FlatMap(every_shard_key).with_output_types(int)
            | "WriteShards" >> beam.ParDo(writer, beam.pvalue.AsSingleton(self._plan), beam.pvalue.AsList(pieces),
                                          **self._moved_side())
        )


class WriteShardsThroughGroupByKey(WriteShardsOfPlan):
    """Pieces routed to their shards, one slice per (piece, shard), grouped by shard through the runner's GroupByKey.

    For every runner: the slices carry their frames (``InlineStore``) or only keys and offsets
    (``SpillStore``, writers read the frames back); no worker holds more than one shard. The
    pieces reach the routing stage through a GroupByKey too, and no Flatten is on their way: a
    stage input the runner materialises in any other way (a fusion break, a Flatten) is what
    Beam's FnApiRunner loses chunks of when it is large (see ``GroupPieces``).
    """

    def expand(self, pieces):
        plan_side = beam.pvalue.AsSingleton(self._plan)
        shard_groups = (
            pieces
            | "GroupPieces" >> GroupPieces(self._store)
            | "RouteToShards" >> beam.ParDo(RouteGroupedPieces(self._store), plan_side, **self._moved_side())
            .with_output_types(tuple[int, Piece])
            | "GroupByShard" >> beam.GroupByKey()
        )
        writer = WriteShard(self._temp_dir, self._store, self._progress)
        written = shard_groups | "WriteShards" >> beam.ParDo(writer, plan_side)
        # No piece at all (no records): no group reaches the routing stage, so the plan writes the empty shards.
        nothing = (
            self._plan
            | "EveryShardIfNoRecords" >> beam.FlatMap(empty_shards_if_no_records)
            .with_output_types(tuple[int, list[Piece]])
            | "WriteEmptyShards" >> beam.ParDo(writer, plan_side)
        )
        return (written, nothing) | "AllShards" >> beam.Flatten()


class WriteShuffledShards(beam.PTransform):
    """PCollection[KeyedRecords] -> shuffled, split, exactly balanced shard files in ``temp_dir``.

    The pieces' frames wait in ``store`` (a ``PieceStore``, default inline) between preparing and
    writing. Returns a dict: ``files`` (PCollection[WrittenShard], one per shard, empty shards
    included) and ``plan`` (a one-element PCollection[ShardPlan]). ``progress_under`` (a run's local
    staging directory) makes the writers count the examples they write there, for the progress display.
    """

    def __init__(self, spec: ShardingSpec, temp_dir: str, store: PieceStore | None = None,
                 progress_under: str | None = None):
        super().__init__()
        self._spec = spec
        self._temp_dir = temp_dir
        self._store = store or InlineStore()
        self._progress = progress_dir(progress_under) if progress_under is not None else None

    def expand(self, records):
        pieces = records | "SortPieces" >> beam.ParDo(PreparePieces(self._store)).with_output_types(Piece)
        tally = None
        if self._spec.ordered:  # keys are input positions, all distinct: no copies to spread
            plan = pieces | "PlanShards" >> beam.CombineGlobally(PlanShards(self._spec, self._store))
        else:
            tally = pieces | "TallyCopies" >> TallyCopies(self._spec, self._store)
            plan = tally["counts"] | "PlanShards" >> beam.CombineGlobally(PlanShards(self._spec, self._store))
        if self._store.pieces_as_side_input:
            writers = WriteShardsFromPieceList(self._temp_dir, self._store, plan, self._progress, tally)
            files = pieces | "WriteShardsFromPieceList" >> writers
        else:
            routed = WriteShardsThroughGroupByKey(self._temp_dir, self._store, plan, self._progress, tally)
            files = pieces | "WriteShardsThroughGroupByKey" >> routed
        return {"files": files, "plan": plan}
