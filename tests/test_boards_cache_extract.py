"""Zipped pins in the cache (issue 36, items 5 and 6): the data held once (the extraction, not the zip
beside it), crash-safe extraction, every extracted file checked before it is returned, and an already
cached `pin_get_many` that reads the board's index once instead of once a pin."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pinstorm import boards
from pinstorm.boards import cache as cache_mod
from pinstorm.boards.errors import IntegrityError
from pinstorm.boards.parallel import pin_get_many


def _pin_categories(board, tmp_path: Path, n: int, files: int = 3) -> dict[str, dict[str, bytes]]:
    expected = {}
    for i in range(n):
        name = f"n{i:08d}"
        folder = tmp_path / "src" / name
        folder.mkdir(parents=True)
        content = {f"{name}_{j}.JPEG": bytes([i, j]) * (700 + 31 * j) for j in range(files)}
        for fname, data in content.items():
            (folder / fname).write_bytes(data)
        board.pin(folder, name, zip=True, description=f"category {i}")
        expected[name] = content
    return expected


class _Requests:
    """Counts the requests a data.txt board sends."""

    def __init__(self, board):
        self.urls: list[str] = []
        session = board.storage.session
        original = session.request

        def request(method, url, *a, **k):
            self.urls.append(url)
            return original(method, url, *a, **k)

        session.request = request


def _web(http_board, tmp_path, n=3):
    source, folder, url = http_board
    expected = _pin_categories(source, tmp_path, n)
    web = boards.board_register("datatxt", name="web", url=url, cache=tmp_path / "webcache")
    return web, expected


def _cache_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()]


def test_the_cache_holds_a_zipped_pin_once_extracted_not_twice(http_board, tmp_path):
    web, expected = _web(http_board, tmp_path)
    name = next(iter(expected))
    paths = web.pin_get(name, extract=True)
    assert {Path(p).name: Path(p).read_bytes() for p in paths} == expected[name]
    files = _cache_files(tmp_path / "webcache")
    assert not [p for p in files if p.suffix == ".zip"], "the zip was kept beside its extraction"
    data = sum(len(b) for b in expected[name].values())
    assert sum(p.stat().st_size for p in files) < data + 8192   # the images once, plus small metadata
    # extracted under the category's name, not a folder named like the zip file
    assert all(Path(p).parent.name == name for p in paths)
    # served again (and offline) from the extraction, without the zip
    assert web.pin_get(name, extract=True) == paths
    assert web.pin_get(name, extract=True, download=False) == paths
    assert web.pin_get(name, extract=True, cache=False) == paths   # every byte checked against the manifest


def test_asking_for_the_archive_itself_downloads_it_again_and_keeps_both(http_board, tmp_path):
    web, expected = _web(http_board, tmp_path)
    name = next(iter(expected))
    paths = web.pin_get(name, extract=True)
    with pytest.raises(IntegrityError, match="extracted files"):
        web.pin_get(name, extract=False, download=False)
    (archive,) = web.pin_get(name, extract=False)
    assert Path(archive).suffix == ".zip" and Path(archive).is_file()
    assert all(Path(p).is_file() for p in paths)   # a reader of the extracted files is not disturbed
    # asked for both, the cache keeps both: neither path goes away under its user
    assert web.pin_get(name, extract=True) == paths and Path(archive).is_file()
    assert web.pin_get(name, extract=False, download=False) == [archive]
    assert web.pin_get(name, extract=True, cache=False) == paths


def test_an_interrupted_extraction_is_redone_never_taken_for_complete(http_board, tmp_path, monkeypatch):
    web, expected = _web(http_board, tmp_path)
    name = next(iter(expected))
    real = cache_mod._write_json

    def killed(path, data):  # the process dies after the folder's rename, before its manifest
        if path.name.endswith(".extracted.json"):
            raise KeyboardInterrupt
        return real(path, data)

    monkeypatch.setattr(cache_mod, "_write_json", killed)
    with pytest.raises(KeyboardInterrupt):
        web.pin_get(name, extract=True)
    out_root = next((tmp_path / "webcache").rglob(cache_mod.EXTRACTED))
    half = out_root / name
    assert half.is_dir() and next(out_root.glob(f"{name}.zip"), None) is None
    (half / f"{name}_0.JPEG").write_bytes(b"half")              # as a kill mid-write would leave it
    (out_root / f".{name}.tmp-123-host-abc").mkdir()          # and a temporary folder of an earlier kill
    (out_root / f".{name}.tmp-123-host-abc" / "x").write_bytes(b"x")
    monkeypatch.setattr(cache_mod, "_write_json", real)
    paths = web.pin_get(name, extract=True)
    assert {Path(p).name: Path(p).read_bytes() for p in paths} == expected[name]
    assert sorted(p.name for p in out_root.iterdir()) == [f".{name}.extracted.json", name]


def test_an_extraction_killed_mid_write_leaves_nothing_used(http_board, tmp_path, monkeypatch):
    from pinstorm.boards.safety import archive

    web, expected = _web(http_board, tmp_path)
    name = next(iter(expected))
    real = archive._Budget.copy
    calls = []

    def dies(self, src, target, member):
        calls.append(member)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(self, src, target, member)

    monkeypatch.setattr(archive._Budget, "copy", dies)
    with pytest.raises(KeyboardInterrupt):
        web.pin_get(name, extract=True)
    monkeypatch.setattr(archive._Budget, "copy", real)
    assert not [p for p in (tmp_path / "webcache").rglob("*.JPEG")]   # no half extraction anywhere
    paths = web.pin_get(name, extract=True, download=False)  # offline: the zip is still there, extracted again
    assert {Path(p).name: Path(p).read_bytes() for p in paths} == expected[name]


def test_a_changed_extracted_file_is_fetched_again_or_named_offline(http_board, tmp_path):
    web, expected = _web(http_board, tmp_path)
    name = next(iter(expected))
    paths = web.pin_get(name, extract=True)
    victim = Path(paths[1])
    victim.write_bytes(b"\0" * victim.stat().st_size)  # same size, new mtime: the stat check catches it
    with pytest.raises(IntegrityError, match="changed since it was extracted"):
        web.pin_get(name, extract=True, download=False)
    again = web.pin_get(name, extract=True)
    assert {Path(p).name: Path(p).read_bytes() for p in again} == expected[name]


def test_rot_under_an_unchanged_stat_is_caught_by_cache_false(http_board, tmp_path):
    web, expected = _web(http_board, tmp_path)
    name = next(iter(expected))
    paths = web.pin_get(name, extract=True)
    victim = Path(paths[0])
    st = victim.stat()
    victim.write_bytes(b"\1" * st.st_size)
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))  # bit rot: size and mtime as recorded
    again = web.pin_get(name, extract=True, cache=False)
    assert {Path(p).name: Path(p).read_bytes() for p in again} == expected[name]


def test_a_local_board_keeps_its_zip_and_the_cache_only_the_extraction(tmp_path):
    local = boards.board_get("local")
    expected = _pin_categories(local, tmp_path, 2)
    name = next(iter(expected))
    paths = local.pin_get(name, extract=True)
    assert {Path(p).name: Path(p).read_bytes() for p in paths} == expected[name]
    assert list((tmp_path / "board").rglob("*.zip"))                 # the board's own zip stays
    assert not list((tmp_path / "cache").rglob("*.zip"))             # the cache: only the extraction
    Path(paths[0]).write_bytes(b"changed")                           # a changed extraction: extracted again
    again = local.pin_get(name, extract=True)
    assert {Path(p).name: Path(p).read_bytes() for p in again} == expected[name]


def test_an_old_cache_layout_is_replaced_by_the_new_one(http_board, tmp_path):
    web, expected = _web(http_board, tmp_path)
    name = next(iter(expected))
    (archive,) = web.pin_get(name, extract=False)
    old = Path(archive).parent / cache_mod.EXTRACTED / f"{name}.zip"   # before: a folder named like the zip
    old.mkdir(parents=True)
    (old / "stale.JPEG").write_bytes(b"x")
    paths = web.pin_get(name, extract=True)
    assert {Path(p).name for p in paths} == set(expected[name])
    assert not old.exists() and not Path(archive).exists()


def test_an_already_cached_batch_reads_the_index_once_not_once_a_pin(http_board, tmp_path):
    web, expected = _web(http_board, tmp_path, n=12)
    names = list(expected)
    first = pin_get_many(names, board=web, extract=True)
    seen = _Requests(web)
    for parallel in (None, 1):
        del seen.urls[:]
        assert pin_get_many(names, board=web, extract=True, parallel=parallel) == first
        assert seen.urls == [f"{web.storage.url}/data.txt"], seen.urls   # one revalidation, no per-pin request
    del seen.urls[:]
    web.pin_get(names[0], extract=True)   # outside a batch, each call still revalidates the index
    web.pin_get(names[1], extract=True)
    assert len(seen.urls) == 2
