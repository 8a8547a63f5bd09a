"""Things in the way of the cache's layout: a file where an entry's folder, the quarantine folder or a key's lock
file belongs (a bad copy, a sync tool). Each was an OS error telling the user to check the file system; now the
cache clears what is its own to clear, and names the fix for what is not."""
from __future__ import annotations

import pytest

from neuron_args.activity import ACTIVITY
from neuron_args.cache import QUARANTINE_DIR, CompileCache
from tests.test_cache import builder, make_key

pytestmark = pytest.mark.usefixtures("fresh_activity")


def test_a_file_where_an_entry_folder_belongs_is_replaced_by_the_rebuilt_entry(tmp_path):
    """A file at ``<root>/<key>`` (a bad copy) failed every run with ENOTDIR and 'check the file system'."""
    cache, key = CompileCache(tmp_path), make_key()
    cache.entry(key).path.write_text("not an entry")
    entry, hit = cache.get_or_build(key, builder(key))
    assert hit is False and entry.status == "complete" and entry.executable_path.read_bytes() == b"exe"


def test_a_file_where_the_corrupt_folder_belongs_does_not_block_moving_entries_aside(tmp_path, caplog):
    """A file at ``<root>/.corrupt`` failed every rebuild of a corrupt entry with EEXIST and 'check the file system'."""
    cache, key = CompileCache(tmp_path), make_key()
    entry, _ = cache.get_or_build(key, builder(key))
    entry.executable_path.write_bytes(b"")  # corrupt: empty
    (tmp_path / QUARANTINE_DIR).write_text("in the way")
    ACTIVITY.verified.clear()  # a later process
    entry, hit = cache.get_or_build(key, builder(key))
    assert hit is False and entry.status == "complete"
    assert [p.name[:32] for p in (tmp_path / QUARANTINE_DIR).iterdir()] == [key.key]
    assert f"{tmp_path / QUARANTINE_DIR} is not a folder; removed it" in caplog.text


def test_a_folder_at_the_lock_file_s_place_is_named_with_the_fix(tmp_path):
    """A directory at ``<root>/.<key>.lock`` failed with EISDIR and 'check the file system of <entry>'."""
    from neuron_args import CompileError

    cache, key = CompileCache(tmp_path), make_key()
    cache.entry(key).lock_path.mkdir()
    with pytest.raises(CompileError) as info:
        cache.get_or_build(key, builder(key))
    assert f"cannot write cache entry {key.key}" in str(info.value) and "(EISDIR)" in str(info.value)
    assert f"fix: remove {cache.entry(key).lock_path} (it is in the way of the cache's own file)" in str(info.value)


