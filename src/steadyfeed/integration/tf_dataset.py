"""``loader.as_tf_dataset()``: a ``tf.data.Dataset`` over ``iter(loader)`` with an exact signature.

Guarantees:

* each iteration of the dataset (each ``iter(ds)``, e.g. each Keras epoch) is
  ``iter(loader)``: the loader's batches from its cursor to the end of that epoch, in
  steadyfeed's order, each exactly once; the next iteration is the next epoch;
* ``element_spec`` is exact: dtypes and per-sample shapes of ``loader.peek(0)``, and a
  fixed batch dimension where every batch is full (``last_batch="pad"``, or ``"drop"``
  with ``on_error="raise"``), else ``None``; under ``collate="pad"`` the per-sample
  dimensions of a padded key (one with a ``"<key>_shape"``) are ``None``;
* the dataset is never re-sharded by ``tf.distribute`` (auto-shard is OFF): steadyfeed
  shards itself, see ``distributed.shard_from_tf_input_context``.

With ``x``/``y`` given, elements are ``(x, y)`` / ``(x, y, weights)`` exactly as
``KerasDataset`` gives them; else the batch dict itself. Its cardinality is unknown to
tf.data (a resumed epoch is shorter), so Keras learns the epoch length after one epoch.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from .layout import BatchLayout
from .shapes import fixed_batch_size, padded_keys, peek_any


def output_signature(loader: Any, layout: BatchLayout | None = None) -> Any:
    """The ``tf.TensorSpec`` structure of the loader's batches (arranged by ``layout``)."""
    sample = peek_any(loader, 0)
    structure = sample if layout is None else layout.to_keras(sample)
    rows = fixed_batch_size(loader)
    # the layout hands on the batch's own arrays, so a padded key is known by its array
    varying = {id(sample[key]) for key in padded_keys(loader, sample)}

    def spec(a):
        item = tuple(None for _ in a.shape[1:]) if id(a) in varying else a.shape[1:]
        return tf.TensorSpec((rows,) + item, tf.as_dtype(a.dtype))

    return tf.nest.map_structure(spec, structure)


def to_tf_dataset(loader: Any, x: Any = None, y: Any = None) -> tf.data.Dataset:
    """See the module docstring. Leave batching and sharding to the loader; add
    ``.prefetch()`` only to overlap a per-batch ``map`` with training."""
    layout = None if x is None and y is None else BatchLayout("x" if x is None else x, y)

    def batches():
        for batch in loader:  # a fresh iter(loader) per tf.data iterator: from the cursor on
            yield batch if layout is None else layout.to_keras(batch)

    dataset = tf.data.Dataset.from_generator(batches, output_signature=output_signature(loader, layout))
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return dataset.with_options(options)
