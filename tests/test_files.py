"""files.py on any machine (no mount namespace): a full disk is a DiskFull naming the file and
the bytes, and leaves no partial file; an append is whole or nothing. The real full
filesystems are in test_hostile_disk.py."""

import errno
import os

import pytest

from steadyfeed import DiskFull, files

pytestmark = pytest.mark.timeout(30)


def _enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_reservation_that_does_not_fit_fails_before_any_byte_and_names_the_file(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "posix_fallocate", _enospc, raising=False)
    target = tmp_path / "cache.bin"
    with pytest.raises(DiskFull) as info:
        files.atomic_write(target, b"x" * 5000)
    err = info.value
    assert err.path == str(target) and err.needed == 5000 and err.errno == errno.ENOSPC
    assert str(target) in str(err) and "5,000 bytes" in str(err)
    assert os.listdir(tmp_path) == []  # neither the file nor its temporary one


def test_a_write_that_runs_out_mid_way_leaves_the_old_file(tmp_path):
    target = tmp_path / "index.npy"
    target.write_bytes(b"old")
    with pytest.raises(DiskFull) as info:
        with files.atomic_file(target) as f:
            f.write(b"new" * 1000)
            _enospc()
    assert info.value.needed >= 3000 and target.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["index.npy"]


def test_a_reserved_file_is_cut_to_what_was_written(tmp_path):
    target = tmp_path / "f"
    with files.atomic_file(target, size=1 << 16) as f:
        f.write(b"abc")
    assert target.read_bytes() == b"abc"


def test_an_append_cut_short_is_taken_back(tmp_path, monkeypatch):
    path = tmp_path / "q.jsonl"
    path.write_bytes(b'{"a": 1}\n')
    real_write, calls = os.write, []

    def half_then_full(fd, data):  # a full disk: part of the line fits, then nothing
        calls.append(len(data))
        if len(calls) == 1:
            return real_write(fd, bytes(data[:4]))
        _enospc()

    monkeypatch.setattr(os, "write", half_then_full)
    with pytest.raises(DiskFull) as info:
        files.append_whole(path, b'{"b": 2}\n')
    monkeypatch.undo()
    assert path.read_bytes() == b'{"a": 1}\n' and info.value.needed == 9
    files.append_whole(path, b'{"b": 2}\n')
    assert path.read_bytes() == b'{"a": 1}\n{"b": 2}\n'


def test_other_errors_pass_through_unchanged(tmp_path):
    with pytest.raises(FileNotFoundError):
        files.append_whole(tmp_path / "missing" / "q.jsonl", b"x\n")
