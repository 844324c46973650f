"""Keeping the loader's epoch number equal to the framework's (framework-free)."""

from __future__ import annotations

from typing import Any


def align_epoch(loader: Any, epoch: int) -> None:
    """Make ``epoch`` the loader's next epoch, if its cursor sits at the start of an epoch.

    A cursor inside an epoch (a run resumed from ``load_state_dict``) is left alone: that
    epoch is finished first.
    """
    state = loader.state_dict()
    if state["next_batch"] == 0 and state["epoch"] != epoch:
        loader.load_state_dict({**state, "epoch": int(epoch)})
