"""Verified bytes: every file of every pin, whichever client wrote it; cheap checks on every cached
read, full ones with cache=False; damaged local versions found and repaired; metadata never dropped."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pins
import pytest
import yaml

from pinstorm import boards
from pinstorm.boards.errors import IntegrityError
from pinstorm.boards.meta import FILE_HASH_FIELD, hash_file, hash_file128, joined_hash, r_hash_strings
from r_support import r110  # noqa: F401 - fixture


def _folder(tmp_path: Path, n: int = 3, size: int = 5000) -> Path:
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    for i in range(n):
        (src / f"part{i}.bin").write_bytes(bytes([i + 1]) * size)
    return src


def _flip(path: Path, keep_mtime: bool = False) -> None:
    """Change one byte in place, same size (optionally restoring the mtime, as a sneaky writer would)."""
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    if keep_mtime:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _version_dir(root: Path, name: str) -> Path:
    (folder,) = [p for p in (root / name).iterdir() if p.is_dir()]
    return folder


def test_r_hash_of_strings_matches_rlang_values():
    # values printed by R 4 with rlang 1.0.6: rlang::hash(c("abc", "def")), rlang::hash("a")
    assert r_hash_strings(["abc", "def"]) == "cde24e2b634c674fd37ffcc3a8a90d4d"
    assert r_hash_strings(["a"]) == "4d52a7da68952b85f039e85a90f9bbd2"


def test_multi_file_pins_record_r_hash_and_per_file_hashes(tmp_path):
    src = _folder(tmp_path)
    boards.pin(src, "multi")
    meta = yaml.safe_load((_version_dir(tmp_path / "board", "multi") / "data.txt").read_text())
    per_file = [hash_file(src / f) for f in meta["file"]]
    assert meta[FILE_HASH_FIELD] == per_file
    assert meta["pin_hash"] == r_hash_strings(per_file) and len(meta["pin_hash"]) == 32
    # pins-python still reads it (it ignores the extra field)
    theirs = pins.board_folder(str(tmp_path / "board"), allow_pickle_read=False)
    assert sorted(Path(p).name for p in theirs.pin_download("multi")) == ["part0.bin", "part1.bin", "part2.bin"]


def test_r_pins_accepts_pinstorm_multi_file_hash_and_pinstorm_verifies_r_multi_file_pins(tmp_path, r110):
    src = _folder(tmp_path)
    boards.pin(src, "multi")
    pin_hash = boards.pin_info("multi")["pin_hash"]
    out = r110.run("""
        b <- board_folder(path)
        got <- try_r(basename(pin_download(b, "multi", hash = pin_hash)))
        pin_upload(b, file.path(src, c("part0.bin", "part1.bin")), "from_r")
        list(got = got, r_hash = pin_meta(b, "from_r")$pin_hash,
             file128 = rlang::hash_file(file.path(src, "part0.bin")))
    """, path=str(tmp_path / "board"), pin_hash=pin_hash, src=str(src))
    assert out["file128"] == hash_file128(src / "part0.bin")  # the 32-hex one-file scheme
    assert sorted(out["got"]) == ["part0.bin", "part1.bin", "part2.bin"]
    # R's multi-file scheme, read and checked by pinstorm in full
    assert out["r_hash"] == r_hash_strings([hash_file(src / "part0.bin"), hash_file(src / "part1.bin")])
    assert len(boards.pin_get("from_r", cache=False)) == 2
    _flip(_version_dir(tmp_path / "board", "from_r") / "part1.bin")
    with pytest.raises(IntegrityError, match="part0.bin.*part1.bin"):  # no per-file hashes: lists the files
        boards.pin_get("from_r", cache=False)


def test_pins_python_multi_file_scheme_is_verified(tmp_path):
    src = _folder(tmp_path, n=2)
    theirs = pins.board_folder(str(tmp_path / "board"), allow_pickle_read=False)
    theirs.pin_upload([str(src / "part0.bin"), str(src / "part1.bin")], "pp")
    meta = theirs.pin_meta("pp")
    assert meta.pin_hash == joined_hash([hash_file(src / "part0.bin"), hash_file(src / "part1.bin")])
    assert len(boards.pin_get("pp", cache=False)) == 2
    _flip(_version_dir(tmp_path / "board", "pp") / "part0.bin", keep_mtime=True)
    with pytest.raises(IntegrityError, match="pin_hash"):
        boards.pin_get("pp", cache=False)


def test_changed_server_file_of_a_multi_file_pin_is_refused_naming_the_file(http_board, tmp_path):
    board, folder, url = http_board
    board.pin(_folder(tmp_path), "multi")
    _flip(_version_dir(folder, "multi") / "part2.bin")
    web = boards.board_register("datatxt", name="web", url=url, cache=tmp_path / "webcache")
    with pytest.raises(IntegrityError, match="'part2.bin'"):
        web.pin_get("multi")
    assert not list((tmp_path / "webcache").rglob("part2.bin"))  # nothing half-verified left in the cache


def test_cached_files_are_checked_on_every_read(http_board, tmp_path):
    board, folder, url = http_board
    src = _folder(tmp_path)
    board.pin(src, "multi")
    web = boards.board_register("datatxt", name="web", url=url, cache=tmp_path / "webcache")
    paths = [Path(p) for p in web.pin_get("multi")]
    good = {p.name: p.read_bytes() for p in paths}

    def intact(result):
        return {Path(p).name: Path(p).read_bytes() for p in result} == good

    _flip(paths[0])  # changed bytes (new mtime): caught by the cheap check, fetched again
    assert intact(web.pin_get("multi"))
    _flip(paths[1], keep_mtime=True)  # same size, same mtime: only a full check sees it
    assert intact(web.pin_get("multi", cache=False))
    paths[2].unlink()  # deleted
    assert intact(web.pin_get("multi"))
    with open(paths[0], "ab") as f:  # grown
        f.write(b"more")
    assert intact(web.pin_get("multi"))
    # offline, a damaged copy is an error, never a returned path
    paths[1].unlink()
    with pytest.raises(IntegrityError, match="part1.bin"):
        web.pin_get("multi", download=False)


def test_flipped_byte_on_a_local_board_is_detected_and_repinning_repairs_it(tmp_path):
    src = _folder(tmp_path)
    boards.pin(src, "multi")
    stored = _version_dir(tmp_path / "board", "multi")
    _flip(stored / "part1.bin", keep_mtime=True)
    with pytest.raises(IntegrityError, match="'part1.bin'"):
        boards.pin_get("multi", cache=False)
    boards.pin(src, "multi")  # same content: no new version, but the stored bytes are repaired
    assert len(boards.pin_versions("multi")) == 1
    assert [Path(p).read_bytes() for p in boards.pin_get("multi", cache=False)] == \
        [(src / f"part{i}.bin").read_bytes() for i in range(3)]
    # one-file pins too, and the cheap check catches a change that moved the mtime
    f = tmp_path / "one.csv"
    pd.DataFrame({"a": [1, 2]}).to_csv(f, index=False)
    boards.pin(f, "one")
    _flip(_version_dir(tmp_path / "board", "one") / "one.csv")
    with pytest.raises(IntegrityError, match="one.csv"):
        boards.pin_get("one")
    boards.pin(f, "one")
    assert Path(boards.pin_get("one", cache=False)[0]).read_bytes() == f.read_bytes()


def test_a_version_stored_in_a_batch_is_verified_in_full_by_its_first_read(tmp_path):
    """Outside a batch a local board stamps what it writes (reading it back hashes nothing); inside one
    it does not, so the first read hashes: a byte changed behind the board's back, mtime kept, is caught."""
    board = boards.board_folder(tmp_path / "b", cache=tmp_path / "cache")
    alone = board.store(_folder(tmp_path), "alone")
    with board.batch():
        bulk = board.store(_folder(tmp_path), "bulk")
    assert board.cache.board_stamp(board.name, "alone", alone).exists()
    stamp = board.cache.board_stamp(board.name, "bulk", bulk)
    assert not stamp.exists()
    _flip(tmp_path / "b" / "bulk" / bulk / "part1.bin", keep_mtime=True)
    with pytest.raises(IntegrityError, match="'part1.bin'"):
        board.pin_get("bulk")
    assert not stamp.exists()  # nothing is recorded as verified that was not
    board.store(_folder(tmp_path), "bulk")  # same bytes: the stored ones are repaired
    assert len(board.pin_get("bulk")) == 3 and stamp.exists()   # verified in full, then stamped


def test_new_metadata_for_the_same_bytes_makes_a_new_version(tmp_path):
    f = tmp_path / "x.txt"
    f.write_text("same bytes")
    boards.pin(f, "x", description="first")
    boards.pin(f, "x", description="first")  # nothing new: no version
    assert len(boards.pin_versions("x")) == 1
    boards.pin(f, "x", description="second")
    assert len(boards.pin_versions("x")) == 2 and boards.pin_info("x")["description"] == "second"
    boards.pin(f, "x", description="second", metadata={"source": "camera"})
    assert boards.pin_info("x")["user"] == {"source": "camera"}
    boards.pin(f, "x", description="second", metadata={"source": "camera"}, title="X")
    info = boards.pin_info("x")
    assert info["title"] == "X" and info["versions"] == 4
    assert list(boards.pin_find("second")["name"]) == ["x"]  # the index shows the new description


# ---- properties ------------------------------------------------------------------------------
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

from pinstorm.boards.meta import combine_hashes, hash_matches  # noqa: E402


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(contents=st.lists(st.binary(max_size=300), min_size=1, max_size=5), flip=st.data())
def test_every_scheme_accepts_its_bytes_and_refuses_any_changed_byte(tmp_path_factory, contents, flip):
    folder = tmp_path_factory.mktemp("files")
    paths = []
    for i, data in enumerate(contents):
        p = folder / f"f{i}"
        p.write_bytes(data)
        paths.append(p)
    hashes = [hash_file(p) for p in paths]
    schemes = [combine_hashes(hashes)]  # pinstorm / R 1.x
    if len(paths) > 1:
        schemes.append(joined_hash(hashes))  # pins-python
    for pin_hash in schemes:
        assert hash_matches(pin_hash, paths) is True
    i = flip.draw(st.integers(0, len(paths) - 1))
    data = bytearray(contents[i]) or bytearray(b"\0")
    j = flip.draw(st.integers(0, len(data) - 1))
    data[j] ^= flip.draw(st.integers(1, 255))
    paths[i].write_bytes(bytes(data))
    for pin_hash in schemes:
        assert hash_matches(pin_hash, paths) is False


_secret_key = st.sampled_from(["secret", "aws_secret_access_key", "password", "token", "api_key",
                               "aws_session_token", "key", "client_secret", "Authorization"])
_PLAIN_KEYS = ["region", "verify", "retries", "max_attempts", "path", "endpoint"]
_plain_key = st.sampled_from(_PLAIN_KEYS)
_secret_value = st.text("ABCDEFGHJKMNPQRSTUVWXYZ", min_size=12, max_size=20).map(lambda s: "S3CR3T" + s)
_options = st.recursive(
    st.dictionaries(_secret_key, _secret_value, max_size=2),
    lambda inner: st.dictionaries(st.one_of(_plain_key, st.just("headers")), inner, max_size=3)
    | st.dictionaries(_plain_key, st.lists(inner, max_size=2), max_size=2),
    max_leaves=8)


@settings(max_examples=60, deadline=None)
@given(options=st.dictionaries(_plain_key, _options, max_size=3))
def test_no_secret_value_survives_at_any_depth(options):
    from pinstorm.boards.registry import _public

    kept, dropped = _public(options)
    assert "S3CR3T" not in yaml.safe_dump(kept)
    if "S3CR3T" in repr(options):
        assert dropped  # the user is told what was left out
    for name in dropped:  # only secret-looking keys and header values are ever left out
        parts = name.replace("[", ".").split(".")
        assert "headers" in parts[:-1] or parts[-1] not in _PLAIN_KEYS, name


_base = st.text("abcdefghijklmnopqrstuvwxyz0123456789_-.T", min_size=1, max_size=40).filter(
    lambda s: ".tmp-" not in s and not s.startswith("pinstorm-stage-"))


@functools.lru_cache(maxsize=1)
def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # reaped: its pid no longer exists
    return child.pid


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(base=_base)
def test_temporary_names_tell_live_owners_from_dead_ones(tmp_path_factory, base):
    from pinstorm.boards.tempnames import is_abandoned, is_temporary, tmp_name

    folder = tmp_path_factory.mktemp("tmp")
    mine = Path(tmp_name(folder / base))
    assert is_temporary(mine.name) and not is_temporary(base)
    mine.mkdir()
    assert not is_abandoned(mine)  # this process is alive
    pid = str(os.getpid())
    dead = mine.with_name(mine.name.replace(f".tmp-{pid}-", f".tmp-{_dead_pid()}-", 1))
    dead.mkdir()
    assert is_abandoned(dead)


@settings(max_examples=40, deadline=None)
@given(hashes=st.lists(st.text("0123456789abcdef", min_size=16, max_size=16), min_size=2, max_size=6))
def test_per_file_hashes_survive_the_data_txt_round_trip(hashes):
    from pinstorm.boards.meta import PinMeta

    meta = PinMeta(file=[f"f{i}" for i in range(len(hashes))], file_size=[1] * len(hashes),
                   pin_hash=r_hash_strings(hashes), type="file", extra={FILE_HASH_FIELD: hashes})
    back = PinMeta.from_yaml(meta.to_yaml())
    assert back.file_hashes() == hashes and back.pin_hash == meta.pin_hash


@settings(max_examples=60, deadline=None)
@given(board=st.text(max_size=12), name=st.text(max_size=12), version=st.text(max_size=12))
def test_cache_folders_stay_inside_their_pin_folder(tmp_path_factory, board, name, version):
    from pinstorm.boards.cache import Cache

    cache = Cache(tmp_path_factory.getbasetemp() / "cache")
    folder = cache.version_dir(board, name, version)
    pin_folder = folder.parent
    assert folder.resolve().parent == pin_folder.resolve() and pin_folder.resolve().parent.parent == cache.root
    assert not folder.name.startswith(".")
