"""Generated protobuf classes of tf.train.Example and SequenceExample (example_pb2, from example.proto by
regenerate.sh), for per-message encode and decode and the tests; they import only protobuf."""
