"""TFRecord feature tables: prebatched, short field names, grouped types.

``dataset(...)`` reads them in tf.data, ``read_numpy(...)`` without TensorFlow.
"""

from featureline.etl.tfrecord.reader import dataset, files, read_numpy
from featureline.etl.tfrecord.records import TFRecordCorruptError

__all__ = ["TFRecordCorruptError", "dataset", "files", "read_numpy"]
