"""tfrbeam: TensorFlow-free TFRecord and tf.train.Example tools and Apache Beam IO."""

__version__ = "0.1.0"
