"""The dataset build: a YAML config turns Parquet/CSV into shuffled, split, sharded TFRecord datasets."""
