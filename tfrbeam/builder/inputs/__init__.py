"""Reading a build's input files: listing them, CSV, Parquet, JSON lines, ORC, Avro and TFRecord as SourceBatches,
the plan-time sample, the Beam read.

files (listing, opening) and compressed (checked decompression); encodings, csv_text (lines,
preamble, long-row scan, byte ranges) and csv (rows to batches); parquet (row groups, the joined
schema); jsonl (blocks of lines, the schema from the first file); orc (stripes); avro (runs of
sync blocks; fastavro is an optional extra); tfrecord (a dataset's shards through its manifest or a
glob, Example records decoded in blocks, record ranges from a read index); varints (ORC's footer, Avro's block headers); batch
(the SourceBatch element), ahead (read-ahead threads); sample (the plan's look at the inputs);
read (the ReadTabular PTransform); progress (rows read and written, counted across processes). May import
tfrbeam.errors, base, tfrecord, codec, layout, beam, builder.config and builder.features; nothing here
imports the rest of the builder.
This package module imports nothing: import the module that owns a name.
"""
