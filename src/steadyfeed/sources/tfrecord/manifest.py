"""The manifest of a packed directory (``pack``'s output).

**Packed directories**: ``TFRecordSource(out_dir)`` reads ``manifest.json`` for the shard
list, record counts and feature specs, so it needs no ``features=``; a missing shard or a
count that differs from the manifest is an error.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence

from ...errors import DataError
from .example import FeatureSpec, parse_features

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = "steadyfeed.tfrecord-dataset"
MANIFEST_VERSION = 1


def manifest_dict(
    samples: int, specs: Mapping[str, FeatureSpec], shards: Sequence[tuple[str, int]], quarantine: Sequence[dict] = ()
) -> dict:
    """The manifest; ``quarantine`` lists the samples ``pack(on_error="skip")`` left out."""
    return {
        "format": MANIFEST_FORMAT,
        "version": MANIFEST_VERSION,
        "samples": samples,
        "encoding": "one bytes_list value per feature: arrays as raw little-endian C-order bytes "
        "(tf.io.decode_raw, then reshape), bytes as is, str as UTF-8",
        "features": {key: spec.to_json() for key, spec in specs.items()},
        "shards": [{"file": name, "records": count} for name, count in shards],
        "quarantine": list(quarantine),
    }


def read_manifest(directory: str) -> tuple[list[str], dict[str, FeatureSpec], list[int]]:
    """(shard paths, feature specs, records per shard) of a packed directory, checked for consistency."""
    path = os.path.join(directory, MANIFEST_NAME)
    if not os.path.exists(path):
        raise DataError(
            f"{directory} has no {MANIFEST_NAME}: it is not a complete steadyfeed.pack output "
            f"(pass a glob of .tfrecord files and features= to read other TFRecord files)"
        )
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
        if manifest.get("format") != MANIFEST_FORMAT or manifest.get("version") != MANIFEST_VERSION:
            raise ValueError(
                f"format {manifest.get('format')!r} version {manifest.get('version')!r}, expected "
                f"{MANIFEST_FORMAT!r} version {MANIFEST_VERSION}"
            )
        shards = [(s["file"], int(s["records"])) for s in manifest["shards"]]
        if any(os.path.basename(name) != name for name, _ in shards):  # shards live in the directory itself
            raise ValueError("a shard file name contains a directory")
        specs = parse_features(manifest["features"])
        samples = int(manifest["samples"])
        if samples != sum(n for _, n in shards):
            raise ValueError(f"samples {samples} is not the sum of the shards' records")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise DataError(f"{path} is not a valid steadyfeed manifest: {exc}") from exc
    return [os.path.join(directory, name) for name, _ in shards], specs, [n for _, n in shards]
