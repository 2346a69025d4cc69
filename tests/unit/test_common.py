"""runtime.common: the atomic write, the background task owner and the handler table."""

from __future__ import annotations

import os

import pytest

from runtime.common.files import write_atomically


def test_write_atomically_replaces_the_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "_metadata"
    path.write_bytes(b"old")
    write_atomically(str(path), b"new")
    assert path.read_bytes() == b"new"
    assert os.listdir(tmp_path) == ["_metadata"]


def test_write_atomically_failure_keeps_the_old_file_and_removes_the_temporary(tmp_path):
    path = tmp_path / "state.bin"
    path.write_bytes(b"old")
    with pytest.raises(TypeError):
        write_atomically(str(path), "not bytes")  # type: ignore[arg-type]
    assert path.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["state.bin"]


def test_write_atomically_needs_the_directory(tmp_path):
    with pytest.raises(FileNotFoundError):
        write_atomically(str(tmp_path / "missing" / "f"), b"x")
