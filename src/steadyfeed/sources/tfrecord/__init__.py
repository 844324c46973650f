"""TFRecord files of ``tf.train.Example`` as a random-access source, and the pieces
``steadyfeed.pack`` writes them with. TensorFlow is never needed.

One module per concept, each documenting its part of the on-disk encoding:

* :mod:`.framing`: TensorFlow's record framing and masked CRC32C, writing and reading
  records, GZIP / ZLIB streams (read through a decompressed copy), a damaged tail, and the
  cached offset index (``<file>.sfidx.npy``);
* :mod:`.example`: ``tf.train.Example`` without TensorFlow, feature specs (given or
  inferred), defaults, checked integer casts, the two accepted encodings of an array feature,
  and ``RecordLayout`` (a batch of a pack's records copied into arrays without parsing, proven exact);
* :mod:`.manifest`: ``manifest.json`` of a packed directory;
* :mod:`.source`: :class:`TFRecordSource`;
* :mod:`.optional`: protobuf and google-crc32c, imported on first use.

The names below are this package's interface; import them from here.
"""

from .example import (
    NATIVE_LISTS,
    VARIABLE_KINDS,
    FeatureSpec,
    check_sample,
    decode_example,
    encode_example,
    example_classes,
    feature_kinds,
    infer_features,
    infer_specs,
    parse_example,
    parse_features,
)
from .framing import (
    COMPRESSIONS,
    FRAMING_BYTES,
    HEADER_BYTES,
    INDEX_SUFFIX,
    INDEX_VERSION,
    RAW_SUFFIX,
    FileIndex,
    RecordWriter,
    compression_name,
    detect_compression,
    frame,
    index_path,
    load_index,
    masked_crc,
    open_index,
    read_record,
    record_name,
    save_index,
    scan,
)
from .manifest import MANIFEST_FORMAT, MANIFEST_NAME, MANIFEST_VERSION, manifest_dict, read_manifest
from .source import INFER_RECORDS, TFRecordSource, require_support

__all__ = [
    "COMPRESSIONS",
    "FileIndex",
    "INFER_RECORDS",
    "RAW_SUFFIX",
    "compression_name",
    "detect_compression",
    "infer_features",
    "open_index",
    "FRAMING_BYTES",
    "FeatureSpec",
    "HEADER_BYTES",
    "INDEX_SUFFIX",
    "INDEX_VERSION",
    "MANIFEST_FORMAT",
    "MANIFEST_NAME",
    "MANIFEST_VERSION",
    "NATIVE_LISTS",
    "RecordWriter",
    "TFRecordSource",
    "VARIABLE_KINDS",
    "check_sample",
    "decode_example",
    "encode_example",
    "example_classes",
    "feature_kinds",
    "frame",
    "index_path",
    "infer_specs",
    "load_index",
    "manifest_dict",
    "masked_crc",
    "parse_example",
    "parse_features",
    "read_manifest",
    "read_record",
    "record_name",
    "require_support",
    "save_index",
    "scan",
]
