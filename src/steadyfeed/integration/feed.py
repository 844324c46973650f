"""KerasFeed: a loader's batches as Keras takes them, worked out from Keras's public calls alone.

Keras drives a ``PyDataset`` through ``on_epoch_begin`` / ``on_epoch_end`` around each Keras
epoch, ``num_batches`` whenever it sizes something, and ``__getitem__`` for each batch
(whose index it may shuffle, and which steadyfeed ignores: the loader's order is the order).
A feed turns those calls into *passes*: runs of consecutive batches of the loader's stream,
one per Keras generator. Without a step count a pass is the rest of one loader epoch; with
``steps_per_epoch=N`` (given to ``as_keras``) it is the next N batches, crossing loader
epochs. What it guarantees, for Keras 3.15 on every backend (``tests/test_keras_feed.py``
replays the call sequences each backend makes; ``tests/keras_scripts`` runs real fits):

* **in order, exactly once**: a pass serves the loader's batches in plan order, each once;
  a Keras epoch that spans several passes or a pass that spans several Keras epochs (Keras's
  own ``steps_per_epoch``, which carries one generator across its epochs) changes nothing;
* **a new pass starts at a loader-epoch boundary**: where the stream stands if that is one,
  else at the start of the next loader epoch, so a call that follows one cut short by step
  limits gets whole epochs. Exceptions: a position set from outside (``load_state_dict``,
  ``LoaderCheckpoint``, ``align_epoch``) is where the next pass starts, and so is the start
  of a pass Keras did not keep (below);
* **what Keras did not keep is served again**: Keras builds an unbuilt model on one batch of
  a throw-away epoch, then calls ``reset()`` (a ``num_batches`` read followed by
  ``on_epoch_end``), and a fit stopped by ``stop_training``, an exception or Ctrl-C leaves its
  epoch open (the next call's first ``num_batches`` reads arrive inside it). Either way the
  epoch's pass, if Keras had not taken all of it, is rolled back: the next pass starts where
  it started. Its first ``KEEP`` batches are served again from memory (copies, made as they
  were served: a batch a process worker lent must not keep its slot for a whole pass);
  a longer one is recomputed from the loader (bit-identical, at the cost of restarting its
  workers). On TensorFlow, ``tf.data`` pulls ahead in threads of its own, so a pass counts
  as incomplete whatever it served;
* **positions for callbacks**: ``trained(n)`` hands out, oldest first, the loader position
  after each batch Keras took, so a callback counting trained steps knows the exact resume
  point (``LoaderCheckpoint``); ``follow()`` gives a callback its own queue of the batches
  themselves, in the same order (``LabelNoiseMonitor``); ``report`` is called once per batch the stream produces
  (never again for a batch served again).

Not seen through Keras's public calls, and so not handled: a build probe on a pass of one
batch (it is taken as a real epoch: that loader epoch is then used up by the probe), and a
``tf.data`` thread of an old, abandoned iterator still prefetching while a new call runs.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import DataError

KEEP = 4  # batches of each pass kept for serving again after a rollback (a build probe takes 1)
Position = tuple  # (epoch, index): a batch of the loader's plan, or a cursor


def _detached(batch: Any) -> Any:
    """``batch`` with its arrays copied, so that keeping it holds no memory lent by a worker
    (``execution/shm.py``: a worker lends only a few batches at once, and copies the rest)."""
    if not isinstance(batch, dict):
        return batch
    return {key: value.copy() if isinstance(value, np.ndarray) else value for key, value in batch.items()}


@dataclass
class _Pass:
    start: Position
    length: int
    taken: int = 0
    kept: list = field(default_factory=list)  # its first KEEP (position, next position, batch)

    @property
    def complete(self) -> bool:
        return self.taken >= self.length


@dataclass
class _KerasEpoch:
    opener: int  # the thread that called on_epoch_begin
    taken: int = 0
    pass_started: bool = False
    pulled_elsewhere: bool = False  # a batch was taken by another thread (tf.data)
    reset: bool = False  # Keras read num_batches in a way only its reset() does: roll back at the end


class KerasFeed:
    def __init__(self, loader: Any, steps_per_epoch: int | None = None):
        self.loader = loader
        self.steps = steps_per_epoch
        self.report: Callable[[Position, Any], None] = lambda position, batch: None
        self._lock = threading.RLock()  # TF calls take() from tf.data threads
        self._batches: Generator[Any, None, None] | None = None  # the loader's iterator while one of its epochs is open
        self._head: Position | None = None  # the loader's cursor as this feed left it (None: not yet)
        self._pass: _Pass | None = None
        self._rollback: _Pass | None = None  # a pass Keras did not keep: the next starts where it did
        self._replay: deque = deque()  # (position, next position, batch) to serve before new ones
        self._epoch: _KerasEpoch | None = None
        self._trained: deque = deque()  # the cursor after each batch of this pass, oldest first
        self._reported: Position | None = None  # the latest position passed to report()
        self._followers: list[deque] = []  # per follower: (position, batch) Keras took, oldest first

    # -- the three things Keras does ---------------------------------------------------------
    def begin(self) -> None:
        with self._lock:
            if self._epoch is not None:  # Keras left the last one open: that call was cut short
                self._close_epoch(kept=False)
            self._epoch = _KerasEpoch(threading.get_ident())

    def end(self) -> None:
        with self._lock:
            if self._epoch is not None:  # (reset() also ends epochs that were never begun)
                self._close_epoch(kept=not self._epoch.reset)

    def length(self) -> int:
        """What ``num_batches`` answers: a starting generator gets its pass's length, any other
        read the length of a whole Keras epoch (Keras's bound and its progress bar)."""
        with self._lock:
            epoch = self._epoch
            if epoch is None:
                return self.full_length()
            if epoch.taken == 0:  # a generator starting inside this epoch
                if not epoch.pass_started:
                    self._start_pass()
                    epoch.pass_started = True
                assert self._pass is not None  # started by this epoch
                return self._pass.length
            if (
                threading.get_ident() == epoch.opener
                and self._pass is not None
                and (epoch.pulled_elsewhere or not self._pass.complete)
            ):
                epoch.reset = True  # only reset() reads here then (or a new call, inside an abandoned epoch)
            return self.full_length()

    def take(self) -> tuple[Position, Any] | None:
        """The next batch of the open pass as ``(position, batch)``; None when no Keras epoch is
        open or the pass is used up (Keras reading shapes: the caller computes the batch alone)."""
        with self._lock:
            epoch = self._epoch
            if epoch is None:
                return None
            if not epoch.pass_started:
                if self._pass is None:  # a batch asked for without a generator's read: by hand
                    self._start_pass()
                epoch.pass_started = True  # else the pass Keras carries across its epochs goes on
            current = self._pass
            if current is None or current.complete:
                return None
            position, after, batch = self._replay.popleft() if self._replay else self._pull()
            current.taken += 1
            epoch.taken += 1
            epoch.pulled_elsewhere |= threading.get_ident() != epoch.opener
            if len(current.kept) < KEEP:
                current.kept.append((position, after, _detached(batch)))
            self._trained.append(after)
            for follower in self._followers:
                follower.append((position, batch))
            fresh = self._reported is None or position > self._reported
            if fresh:
                self._reported = position
        if fresh:
            self.report(position, batch)
        return position, batch

    # -- for callbacks -----------------------------------------------------------------------
    def full_length(self) -> int:
        """Batches of a whole Keras epoch: the step count, else the loader epoch's."""
        return self.steps or self.loader.batches_in(self.position()[0])

    def position(self) -> Position:
        """The loader's cursor: ``(epoch, next batch)``."""
        return self.loader.cursor

    def trained(self, count: int) -> list[Position]:
        """The loader's cursor after each of the next ``count`` batches Keras took, oldest first."""
        with self._lock:
            return [self._trained.popleft() for _ in range(min(count, len(self._trained)))]

    def follow(self) -> deque:
        """A queue of its own that gets ``(position, batch)`` for every batch Keras takes from now
        on, in the order taken (a batch served again after a rollback comes again), emptied when a
        pass starts like ``trained``'s; the follower pops what it has seen. ``unfollow`` it after."""
        with self._lock:
            follower: deque = deque()
            self._followers.append(follower)
            return follower

    def unfollow(self, follower: deque) -> None:
        with self._lock:
            self._followers = [f for f in self._followers if f is not follower]

    def close(self) -> None:
        """Stop the loader's epoch in progress (its workers stop) and forget every pass."""
        with self._lock:
            self._drop_stream()
            self._pass = self._rollback = self._epoch = None
            self._replay.clear()
            self._trained.clear()
            for follower in self._followers:
                follower.clear()
            self._head = None

    # -- passes --------------------------------------------------------------------------------
    def _close_epoch(self, kept: bool) -> None:
        epoch, self._epoch = self._epoch, None
        assert epoch is not None  # called for an open epoch
        current = self._pass
        if current is None:
            return
        if not kept and (not current.complete or epoch.pulled_elsewhere):
            self._rollback, self._pass = current, None
        elif current.complete:
            self._pass = None
        # else: Keras keeps its generator for its next epoch (steps_per_epoch): the pass goes on

    def _start_pass(self) -> None:
        start = self._choose_start()
        length = self.steps or self.loader.batches_in(start[0]) - start[1]
        self._pass = _Pass(start, length)
        self._trained.clear()
        for follower in self._followers:
            follower.clear()

    def _choose_start(self) -> Position:
        cursor = self.position()
        if cursor != self._head:  # set from outside (or before this feed's first pass): start there
            self._drop_stream()
            self._rollback, self._reported = None, None
            self._replay.clear()
            self._head = cursor
            return cursor
        if self._rollback is not None:
            undone, self._rollback = self._rollback, None
            self._replay = deque(undone.kept)
            resume = undone.kept[-1][1] if undone.kept else undone.start
            if self._head != resume:
                self._seek(resume)
            return undone.start
        if self.steps or cursor[1] == 0:
            return cursor
        return self._seek((cursor[0] + 1, 0))

    # -- the loader's stream --------------------------------------------------------------------
    def _seek(self, position: Position) -> Position:
        self._drop_stream()
        self.loader.seek(*position)
        self._head = self.position()
        return position

    def _drop_stream(self) -> None:
        batches, self._batches = self._batches, None
        if batches is not None:
            batches.close()  # mid-epoch the loader stops its workers; the cursor stays where it is

    def _pull(self) -> tuple[Position, Position, Any]:
        """The loader's next batch with its position and the cursor after it."""
        while True:
            if self._batches is None:
                self._batches = iter(self.loader)
            epoch = self.position()[0]
            try:
                batch = next(self._batches)
            except StopIteration:  # the loader's epoch ended before the pass had all its batches
                self._batches = None
                self._head = self.position()
                if self.steps:
                    continue  # a pass of N steps crosses into the next loader epoch
                raise self._short_epoch(epoch) from None
            except BaseException:
                self._batches = None  # a generator that raised is finished; the cursor names the batch
                self._head = self.position()
                raise
            after = self._head = self.position()
            index = after[1] - 1 if after[0] == epoch else self.loader.batches_in(epoch) - 1
            if after[1] == 0:  # the loader's epoch is done: finish it now, so it keeps its workers
                next(self._batches, None)
                self._batches = None
            return (epoch, index), after, batch

    def _short_epoch(self, epoch: int) -> Exception:
        skipped = sum(1 for entry in self.loader.quarantine_report() if entry["epoch"] == epoch)
        current = self._pass
        assert current is not None  # raised while taking a batch of the open pass
        if not skipped:
            return RuntimeError(
                f"steadyfeed bug: epoch {epoch} of the loader ended after {current.taken} of "
                f"the {current.length} batches of its pass"
            )
        return DataError(
            f"epoch {epoch} of the loader ended after {current.taken} of the {current.length} batches "
            f"Keras was told: on_error='skip' left out whole batches ({skipped} samples of this epoch "
            "failed; see loader.quarantine_report())"
        )
