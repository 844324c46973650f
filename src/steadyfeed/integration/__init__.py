"""Bridges from a :class:`~steadyfeed.Loader` to the training frameworks.

One small module per concept; each imports its framework at its own top, and is
itself imported only on demand (``loader.as_keras()``, ``steadyfeed.keras``, ...), so
``import steadyfeed`` stays numpy-only.

* ``layout``        which batch keys become Keras's ``(x, y, sample_weight)`` (no framework)
* ``shapes``        what batches look like, via ``loader.peek`` (no framework)
* ``epochs``        keeping the loader's epoch equal to the framework's (no framework)
* ``checks``        batch against ``model.inputs``: errors that name the key, the input and both shapes
* ``feed``          the loader's batches as Keras takes them, from its public calls alone (no framework)
* ``keras_dataset`` :class:`KerasDataset`, a ``keras.utils.PyDataset``
* ``callbacks``     ``LoaderMonitor`` and ``LoaderCheckpoint``
* ``tf_dataset``    ``tf.data.Dataset`` with an exact output signature
* ``torch_dataset`` ``torch.utils.data.IterableDataset`` of tensors
* ``distributed``   ``shard_index`` / ``shard_count`` from JAX, ``tf.distribute`` or ``torch.distributed``
"""
