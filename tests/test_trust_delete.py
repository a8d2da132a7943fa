"""Nothing is deleted unasked (issue 17, cases 9 and 11).

* `pinstorm remove` asks on a terminal, and refuses without `--yes` when it cannot ask.
* `pin_versions_prune` racing real writer and reader processes (spawned, on a local folder board and
  on a bucket of moto's S3 server): with `grace=` it never deletes a version younger than that (so no
  writer loses the version it just wrote; the default, as pins-python's, is no grace: issue 33), and a
  reader of a version pruned under it gets complete bytes or a `VersionNotFound` naming pin, version
  and board, never a torn read, a bare `FileNotFoundError` or `PinNotFound`.
"""

from __future__ import annotations

import datetime as dt
import multiprocessing
import os
import pty
import select
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

import prune_support
from pinstorm import boards
from pinstorm.boards.errors import VersionNotFound
from pinstorm.boards.meta import format_created
from servers import s3

s3_server = pytest.fixture(scope="module", name="s3_server")(s3.serve)

PIN = prune_support.PIN
SEEDED = 8          # old versions the pruner deletes while readers read them
FILES = {"local": 24, "s3": 6}  # files per seeded version: deleting and reading one takes a while
WRITERS, READERS = 2, 3
SECONDS = 3.0       # how long the workers race (after all of them started)


# ---- case 11: prune against writers and readers ---------------------------------------------------
def _seed_sources(tmp_path: Path, files: int) -> list[tuple[Path, str]]:
    """SEEDED versions of FILES files each, pinned once to a scratch board (one pin each, so no
    pin() waits for the next second); returns (version folder, hash suffix) per version."""
    scratch = boards.board_register("local", name="scratch", path=tmp_path / "scratch")
    out = []
    for i in range(SEEDED):
        src = tmp_path / "src" / f"s{i}"
        src.mkdir(parents=True)
        for f in range(files):
            (src / f"f{f:02d}.bin").write_bytes(bytes([i, f]) * 2048)
        scratch.pin(src, f"s{i}")
        version = scratch.list_versions(f"s{i}")[-1]
        out.append((tmp_path / "scratch" / f"s{i}" / version, version.split("-", 1)[1]))
    return out


def _old_names(sources, first_age: float) -> tuple[list[str], list[float]]:
    """Names of versions created long ago (oldest first, 100 s apart), and their ages in seconds."""
    now = time.time()
    ages = [first_age - i * 100 for i in range(len(sources))]
    names = [f"{format_created(dt.datetime.fromtimestamp(now - a, dt.timezone.utc))}-{suffix}"
             for a, (_, suffix) in zip(ages, sources)]
    return names, ages


def _seed_local(root: Path, pin: str, sources, first_age: float) -> tuple[list[str], list[float]]:
    names, ages = _old_names(sources, first_age)
    for (folder, _), name, age in zip(sources, names, ages):
        dest = root / pin / name
        shutil.copytree(folder, dest)
        when = time.time() - age
        for p in [*dest.iterdir(), dest]:  # stored as long ago as the name says
            os.utime(p, (when, when))
    return names, ages


def _seed_s3(fs, bucket: str, pin: str, sources, first_age: float) -> tuple[list[str], list[float]]:
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    names, ages = _old_names(sources, first_age)
    local, remote = [], []
    for (folder, _), name in zip(sources, names):
        for f in sorted(folder.iterdir()):
            local.append(str(f))
            remote.append(f"{bucket}/boards/{pin}/{name}/{f.name}")
    fs.put(local, remote)
    keys = s3_backends[DEFAULT_ACCOUNT_ID]["global"].buckets[bucket].keys
    for name, age in zip(names, ages):  # the server stored them as long ago as their names say
        for key in list(keys):
            if key.startswith(f"boards/{pin}/{name}/"):
                keys[key].last_modified = dt.datetime.utcfromtimestamp(time.time() - age)
    return names, ages


@pytest.mark.slow  # 7 spawned processes for a few seconds (about 10 s; 30 s on a loaded machine)
@pytest.mark.parametrize("where", ["local", pytest.param("s3", marks=pytest.mark.once)])
def test_prune_against_writers_and_readers(where, tmp_path, request):
    sources = _seed_sources(tmp_path, FILES[where])
    old_age = 3600.0 + SEEDED * 100
    if where == "local":
        root = tmp_path / "board"
        spec = {"kind": "local", "name": "team", "options": {"path": str(root)}}
        seeded, ages = _seed_local(root, prune_support.OLD, sources, old_age)
        stale, _ = _seed_local(root, PIN, sources[:2], 2 * old_age)
    else:
        s3_server = request.getfixturevalue("s3_server")
        bucket = f"prune-{uuid.uuid4().hex[:8]}"
        spec = {"kind": "s3", "name": "team",
                "options": {"bucket": bucket, "path": "boards", **s3_server.storage_options()}}
        fs = boards.board_register("s3", name="seed", create_bucket=True, **spec["options"]).storage.fs
        seeded, ages = _seed_s3(fs, bucket, prune_support.OLD, sources, old_age)
        stale, _ = _seed_s3(fs, bucket, PIN, sources[:2], 2 * old_age)
    board = boards.board_register(spec["kind"], name=spec["name"], cache=tmp_path / "parent-cache",
                                  **spec["options"])
    assert board.list_versions(prune_support.OLD) == seeded and board.list_versions(PIN) == stale
    board.pin({"base": True}, prune_support.OLD)  # the newest versions when the race starts: young, kept
    board.pin({"base": True}, PIN)
    base = board.list_versions(PIN)[-1]
    spec.update(cache=str(tmp_path / "caches"), seconds=SECONDS, seeded={prune_support.OLD: seeded}, ages=ages,
                files=FILES[where], grace=60)  # the writers' versions are protected by an explicit grace=

    ctx = multiprocessing.get_context("spawn")
    ready, results, start = ctx.Queue(), ctx.Queue(), ctx.Event()
    roles = [("writer", i) for i in range(WRITERS)] + [("reader", i) for i in range(READERS)] + [("pruner", 0)]
    procs = [ctx.Process(target=prune_support.run, args=(role, i, spec, ready, start, results), daemon=True)
             for role, i in roles]
    for p in procs:
        p.start()
    try:
        for _ in procs:
            ready.get(timeout=120)
        start.set()
        outs = [results.get(timeout=120 + SECONDS) for _ in procs]
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()

    errors = [(o["role"], o["index"], e) for o in outs for e in o["errors"]]
    assert errors == [], "\n".join(map(str, errors))
    writers = {o["index"]: o["ok"] for o in outs if o["role"] == "writer"}
    assert all(n > 0 for n in writers.values()), writers
    readers = [o for o in outs if o["role"] == "reader"]
    assert sum(o["ok"] + len(o["gone"]) for o in readers) > 0
    for version, message in [g for o in readers for g in o["gone"]]:
        assert "'old'" in message and version in message and "'team'" in message, message
    # the pruner deleted exactly the old versions: none a writer had just written, never a newest one
    deleted = sorted(v for o in outs if o["role"] == "pruner" for v in o["deleted"])
    assert deleted == sorted([(prune_support.OLD, v) for v in seeded] + [(PIN, v) for v in stale])
    assert board.list_versions(prune_support.OLD) == [board.list_versions(prune_support.OLD)[-1]]
    remaining = board.list_versions(PIN)
    assert remaining[0] == base
    values = {tuple(sorted(board.pin_get(PIN, version=v).items())) for v in remaining[1:]}
    assert values == {(("i", i), ("writer", w)) for w, n in writers.items() for i in range(n)}


def test_prune_keeps_young_versions_unless_grace_is_zero(tmp_path):
    board = boards.board_register("local", name="g", path=tmp_path / "g")
    for i in range(3):
        board.pin({"i": i}, "obj")
    versions = board.list_versions("obj")
    assert board.pin_versions_prune("obj", n=1, grace=60) == []  # all younger than grace=
    assert board.pin_versions_prune("obj", days=0, grace=60) == []
    assert board.pin_versions_prune("obj", n=1) == versions[:2]  # the default: no grace, as pins-python
    assert board.list_versions("obj") == versions[2:]  # the newest always stays
    assert board.pin_versions_prune("obj", n=1, grace=0) == []
    with pytest.raises(ValueError, match="grace"):
        board.pin_versions_prune("obj", n=1, grace=-1)


def test_a_slow_upload_is_young_when_it_appears(tmp_path):
    """A version named an hour ago (its writer took that long to upload) but stored just now is kept."""
    root = tmp_path / "slow"
    board = boards.board_register("local", name="slow", path=root)
    board.pin({"i": 0}, "obj")
    (first,) = board.list_versions("obj")
    sources = [(root / "obj" / first, first.split("-", 1)[1])]
    names, _ = _old_names(sources, 3600.0)
    shutil.copytree(root / "obj" / first, root / "obj" / names[0])  # stored now, named an hour ago
    assert board.pin_versions_prune("obj", n=1, grace=60) == []
    when = time.time() - 3600
    os.utime(root / "obj" / names[0] / "data.txt", (when, when))  # now it was stored an hour ago too
    assert board.pin_versions_prune("obj", n=1, grace=60) == [names[0]]
    assert board.list_versions("obj") == [first]


def test_a_version_deleted_under_a_reader_is_version_not_found(tmp_path, monkeypatch):
    """The read path itself: a version whose folder goes between listing and reading."""
    board = boards.board_register("local", name="solo", path=tmp_path / "solo")
    board.pin({"a": 1}, "obj")
    old = board.list_versions("obj")[-1]
    board.pin({"a": 2}, "obj")
    real = type(board).read_meta

    def read_meta_after_a_prune(self, name, version):  # the pruner wins the race right here
        if version == old and (tmp_path / "solo" / "obj" / old).exists():
            self.storage.delete(name, [old])
        return real(self, name, version)

    monkeypatch.setattr(type(board), "read_meta", read_meta_after_a_prune)
    with pytest.raises(VersionNotFound, match=rf"'obj'.*{old}.*'solo'"):
        board.pin_get("obj", version=old)
    monkeypatch.undo()
    assert board.pin_get("obj") == {"a": 2}


# ---- case 9: remove asks, and refuses when it cannot ask -----------------------------------------
def _exe() -> str:
    return shutil.which("pinstorm", path=str(Path(sys.executable).parent)) or "pinstorm"


@pytest.fixture
def cli_env(tmp_path):
    env = dict(os.environ)
    env.update(PINSTORM_CONFIG=str(tmp_path / "cfg.yaml"), PINSTORM_BOARD=str(tmp_path / "default"),
               PINSTORM_CACHE=str(tmp_path / "cli-cache"))
    subprocess.run([_exe(), "board", "register", "local", "--name", "team", "--path", str(tmp_path / "team")],
                   env=env, check=True, capture_output=True, timeout=120)
    note = tmp_path / "notes.txt"
    note.write_text("keep me")
    subprocess.run([_exe(), "pin", str(note), "--board", "team"], env=env, check=True, capture_output=True,
                   timeout=120)
    return env


def _versions(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "team" / "notes").glob("*") if (p / "data.txt").is_file())


@pytest.mark.parametrize("stdin", ["n\n", "y\n", ""])
def test_remove_refuses_without_yes_when_stdin_is_not_a_terminal(stdin, tmp_path, cli_env):
    before = _versions(tmp_path)
    r = subprocess.run([_exe(), "remove", "notes", "--board", "team"], input=stdin, env=cli_env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "--yes" in r.stderr and "not a terminal" in r.stderr and "'notes'" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert _versions(tmp_path) == before != []
    r = subprocess.run([_exe(), "remove", "notes", "--board", "team", "--version", before[0]], input=stdin,
                       env=cli_env, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "--yes" in r.stderr and _versions(tmp_path) == before


def _on_a_terminal(args: list[str], answer: bytes, env: dict) -> tuple[int, str]:
    """Run the command with a pseudo-terminal as stdin/stdout, answer its question, return (code, output)."""
    primary, secondary = pty.openpty()
    p = subprocess.Popen(args, stdin=secondary, stdout=secondary, stderr=secondary, env=env, close_fds=True)
    os.close(secondary)
    seen = b""
    deadline = time.monotonic() + 120
    try:
        while b"[y/N]" not in seen and p.poll() is None and time.monotonic() < deadline:
            if select.select([primary], [], [], 0.5)[0]:
                seen += os.read(primary, 4096)
        if b"[y/N]" in seen:
            os.write(primary, answer)
        while time.monotonic() < deadline:
            if select.select([primary], [], [], 0.5)[0]:
                try:
                    chunk = os.read(primary, 4096)
                except OSError:  # the child closed the terminal
                    break
                if not chunk:
                    break
                seen += chunk
            elif p.poll() is not None:
                break
        return p.wait(timeout=60), seen.decode(errors="replace")
    finally:
        os.close(primary)
        if p.poll() is None:
            p.kill()


@pytest.mark.parametrize("answer,removed", [(b"n\n", False), (b"\n", False), (b"yes\n", True), (b"y\n", True)])
def test_remove_on_a_terminal_removes_only_after_yes(answer, removed, tmp_path, cli_env):
    code, out = _on_a_terminal([_exe(), "remove", "notes", "--board", "team"], answer, cli_env)
    assert "Remove pin 'notes' and all its versions from board 'team'?" in out, out
    assert (code == 0) == removed, out
    assert (_versions(tmp_path) == []) == removed


def test_remove_with_yes_does_not_ask(tmp_path, cli_env):
    r = subprocess.run([_exe(), "remove", "notes", "--board", "team", "--yes"], input="", env=cli_env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "removed pin 'notes'" in r.stdout and _versions(tmp_path) == []
