"""folder_swap: a cache folder replaced whole, and replacements in one parent taken one at a time."""

from __future__ import annotations

import multiprocessing
import threading
import time

from hetero_core.cache import folder_swap


def folder(path, text):
    path.mkdir()
    (path / "config.json").write_text(text)
    return path


def test_swap_in_replaces_a_folder_with_files_and_leaves_no_sibling(tmp_path):
    target = folder(tmp_path / "model", "old")
    folder_swap.swap_in(folder(tmp_path / ".model.new.tmp", "new"), tmp_path / "model")
    assert (target / "config.json").read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


def test_swap_in_to_a_missing_folder_renames(tmp_path):
    folder_swap.swap_in(folder(tmp_path / ".model.new.tmp", "new"), tmp_path / "model")
    assert (tmp_path / "model" / "config.json").read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


def test_the_path_always_names_a_whole_folder_while_it_is_swapped(tmp_path):
    """A reader looking at the folder's path while it is replaced over and over never finds it
    missing (where this kernel exchanges in one step, as Linux on ext4, tmpfs and overlayfs do)."""
    target = folder(tmp_path / "model", "0")
    missing = []
    done = threading.Event()

    def read():
        while not done.is_set():
            try:
                (target / "config.json").read_text()
            except FileNotFoundError:
                missing.append(1)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for i in range(200):
            folder_swap.swap_in(folder(tmp_path / f".model.{i}.tmp", str(i)), target)
    finally:
        done.set()
        reader.join()
    assert (target / "config.json").read_text() == "199"
    if folder_swap._exchange(folder(tmp_path / "a", "a"), folder(tmp_path / "b", "b")):
        assert missing == []


def _hold(parent, entered, release):
    with folder_swap.exclusive(parent):
        entered.set()
        release.wait(30)


def test_exclusive_waits_for_another_process_holding_the_lock(tmp_path):
    context = multiprocessing.get_context("spawn")
    entered, release = context.Event(), context.Event()
    holder = context.Process(target=_hold, args=(tmp_path, entered, release))
    holder.start()
    try:
        assert entered.wait(60)
        got = threading.Event()

        def take():
            with folder_swap.exclusive(tmp_path):
                got.set()

        taker = threading.Thread(target=take)
        taker.start()
        time.sleep(0.5)
        assert not got.is_set()  # the other process holds it
        release.set()
        taker.join(30)
        assert got.is_set()
    finally:
        release.set()
        holder.join(30)
    assert list(tmp_path.iterdir()) == []  # no lock file left behind
