"""The builder's features: what a column becomes (specs), how a type is inferred from a file or text, the
vectorised conversion of Arrow batches into feature columns, and file contents read as features."""
