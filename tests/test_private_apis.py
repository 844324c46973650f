"""The private APIs steadyfeed relies on where no public one exists, each checked here so that
a Python or library release that removes one fails this test instead of a user's run.

* ``multiprocessing.spawn._check_not_importing_main``: the check ``Process.start()`` makes,
  called before a process worker creates anything (``execution/workers.py``);
* ``_posixshmem.shm_unlink``: unlinks a shared-memory segment that ``SharedMemory()`` cannot
  attach (``execution/shm.py``);
* ``_posixshmem.shm_open``: a file descriptor of a segment, to reserve its pages with
  ``os.posix_fallocate`` (``shm.reserve``): ``SharedMemory`` shows no descriptor publicly, and
  without the reservation a too-small /dev/shm is a SIGBUS instead of an error.

steadyfeed reads no other library's private internals (Keras, TensorFlow, Ray included).
"""

import os
import sys

import pytest


def test_the_spawned_child_check_exists():
    import multiprocessing.spawn

    assert callable(multiprocessing.spawn._check_not_importing_main)
    multiprocessing.spawn._check_not_importing_main()  # in a process that is no spawned child: a no-op


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX shared memory")
def test_unlink_by_name_exists_and_unlinks_an_unattachable_segment():
    import _posixshmem
    from multiprocessing import shared_memory

    from steadyfeed.execution import shm

    name = f"{shm.PREFIX}test{os.getpid():x}{os.urandom(2).hex()}"
    os.close(_posixshmem.shm_open("/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600))  # empty: no size
    with pytest.raises(ValueError):
        shared_memory.SharedMemory(name=name)  # why the private call is needed
    shm.ConsumerSlots().discard([name])
    with pytest.raises(FileNotFoundError):
        shared_memory.SharedMemory(name=name)


def test_steadyfeed_reads_no_call_stack():
    import steadyfeed

    root = os.path.dirname(steadyfeed.__file__)
    offenders = []
    for folder, _, files in os.walk(root):
        for name in files:
            if name.endswith(".py"):
                text = open(os.path.join(folder, name), encoding="utf-8").read()
                if "_getframe" in text or "f_locals" in text or "inspect.stack" in text:
                    offenders.append(os.path.relpath(os.path.join(folder, name), root))
    assert offenders == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="posix_fallocate on POSIX shared memory")
def test_a_segment_can_be_opened_by_name_and_its_pages_reserved():
    import _posixshmem

    from steadyfeed.execution import shm

    name = f"{shm.PREFIX}test{os.getpid():x}{os.urandom(2).hex()}"
    segment = shm.create_reserved(name, 3 * 4096)
    try:
        fd = _posixshmem.shm_open("/" + name, os.O_RDWR, mode=0o600)  # what shm.reserve opens
        try:
            assert os.fstat(fd).st_blocks * 512 >= 3 * 4096  # the pages are backed already
        finally:
            os.close(fd)
    finally:
        segment.close()
        segment.unlink()
