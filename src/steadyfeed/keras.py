"""steadyfeed for Keras 3 (TensorFlow, JAX and PyTorch backends): the public names.

    import steadyfeed as sf
    from steadyfeed.keras import LabelNoiseMonitor, LoaderCheckpoint, LoaderMonitor

    train = sf.Loader(source, 64, shuffle=True, workers=4, mode="process")
    val = sf.Loader(val_source, 64)
    model.fit(train.as_keras(), validation_data=val.as_keras(), epochs=10,
              callbacks=[LoaderMonitor(train), keras.callbacks.BackupAndRestore("ckpt", save_freq=100),
                         LoaderCheckpoint(train, "ckpt-loader", save_freq=100)])

``LabelNoiseMonitor(train)`` (a Loader built with ``with_ids=True``) records which training samples
look mislabeled during the same fit (``steadyfeed.diagnostics.label_noise``).

Importing this module imports Keras; ``import steadyfeed`` alone never does.
"""

from .integration.callbacks import LoaderCheckpoint, LoaderMonitor, epoch_figures
from .integration.checks import InputMismatch
from .integration.distributed import shard_from_jax, shard_from_tf_input_context, shard_from_torch
from .integration.epochs import align_epoch
from .integration.keras_dataset import KerasDataset
from .integration.noise_monitor import LabelNoiseMonitor

__all__ = [
    "InputMismatch",
    "KerasDataset",
    "LabelNoiseMonitor",
    "LoaderCheckpoint",
    "LoaderMonitor",
    "align_epoch",
    "epoch_figures",
    "shard_from_jax",
    "shard_from_tf_input_context",
    "shard_from_torch",
]
