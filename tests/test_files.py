"""The two write-safety helpers every writer shares: reading a JSONL file whose writer may have been killed
mid-line, and a folder that appears whole or not at all."""

from __future__ import annotations

from pathlib import Path

import pytest

from searchteam.errors import JsonlError
from searchteam.files import atomic_dir, read_jsonl_numbered, read_jsonl_tolerant


def test_a_torn_last_line_is_left_out_and_repair_cuts_it(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    path.write_bytes(b'{"a": 1}\n\n{"a": 2}\n{"a": "caf\xc3')  # cut inside a UTF-8 character
    assert read_jsonl_numbered(path) == [(1, {"a": 1}), (3, {"a": 2})]
    assert path.read_bytes().endswith(b"\xc3")  # reading alone leaves the file as it is
    assert read_jsonl_tolerant(path, repair=True) == [{"a": 1}, {"a": 2}]
    assert path.read_bytes() == b'{"a": 1}\n\n{"a": 2}\n'


def test_repair_ends_a_whole_last_line_with_its_newline(tmp_path: Path) -> None:
    """A kill between a record and its newline: the record stays, and the next append starts a line."""
    path = tmp_path / "log.jsonl"
    path.write_bytes(b'{"a": 1}\n{"a": 2}')
    assert read_jsonl_tolerant(path, repair=True) == [{"a": 1}, {"a": 2}]
    with path.open("a", encoding="utf-8") as fh:
        fh.write('{"a": 3}\n')
    assert read_jsonl_tolerant(path) == [{"a": 1}, {"a": 2}, {"a": 3}]


def test_a_bad_line_before_the_last_is_damage_not_a_tear(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    path.write_bytes(b'{"a": 1}\n{"a": \n{"a": 3}\n')
    with pytest.raises(JsonlError, match=r"log.jsonl:2: not a JSON line"):
        read_jsonl_tolerant(path, repair=True)
    assert path.read_bytes() == b'{"a": 1}\n{"a": \n{"a": 3}\n'  # nothing cut


def test_an_atomic_folder_replaces_the_old_one_whole(tmp_path: Path) -> None:
    target = tmp_path / "entry"
    with atomic_dir(target) as folder:
        (folder / "old").write_text("1")
    with atomic_dir(target) as folder:
        assert not target.joinpath("new").exists()  # nothing shows before the block ends
        (folder / "new").write_text("2")
    assert sorted(p.name for p in target.iterdir()) == ["new"]
    assert [p.name for p in tmp_path.iterdir()] == ["entry"]  # no temporary folder left


def test_a_failed_write_leaves_the_old_folder_and_no_temporary_one(tmp_path: Path) -> None:
    target = tmp_path / "entry"
    with atomic_dir(target) as folder:
        (folder / "old").write_text("1")
    with pytest.raises(RuntimeError), atomic_dir(target) as folder:
        (folder / "half").write_text("2")
        raise RuntimeError("killed half-way")
    assert sorted(p.name for p in target.iterdir()) == ["old"]
    assert [p.name for p in tmp_path.iterdir()] == ["entry"]


def test_keep_lets_a_folder_another_process_finished_stay(tmp_path: Path) -> None:
    target = tmp_path / "entry"

    def complete(folder: Path) -> bool:
        return (folder / "COMPLETE").is_file()

    target.mkdir()
    (target / "partial").write_text("")
    with atomic_dir(target, keep=complete) as folder:  # an incomplete folder is replaced
        (folder / "COMPLETE").write_text("first")
    with atomic_dir(target, keep=complete) as folder:  # a complete one stays
        (folder / "COMPLETE").write_text("second")
    assert (target / "COMPLETE").read_text() == "first" and not (target / "partial").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["entry"]
