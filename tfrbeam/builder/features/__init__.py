"""The builder's features: what a column becomes (specs), the vectorised conversion of Arrow batches into feature
columns, and file contents read as features. The lowest room of the builder: it imports no other."""
