"""The build as a Beam pipeline: the plan, the graph (read → convert → key → shuffle → shard), sequence
builds, splits from the data, datasets from rows in memory, and the commit that publishes the result."""
