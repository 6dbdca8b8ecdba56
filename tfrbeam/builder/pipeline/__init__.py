"""The build as a Beam pipeline: the config resolved against its inputs (and inferred for ``infer-config``), the
runner and its workers, the plan, the graph (read → convert → key → shuffle → shard), sequence builds, splits from
the data, rows from a pipeline of your own, and the commit that publishes the result."""
