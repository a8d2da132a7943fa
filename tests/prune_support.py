"""Workers for tests/test_trust_delete.py: writers, readers and a pruner sharing one board, each a
spawned process (importable by name, as multiprocessing's spawn start method needs)."""

from __future__ import annotations

import random
import time
import traceback

PIN = "p"        # writers pin new versions of it; the pruner keeps its newest 1 (and the young ones)
OLD = "old"      # readers read its old versions while the pruner deletes them, oldest first


def _board(spec: dict, cache: str):
    from pinstorm import boards

    return boards.board_register(spec["kind"], name=spec["name"], cache=cache, **spec["options"])


def _error(e: BaseException) -> tuple[str, str]:
    return type(e).__name__, f"{e}"[:400] + traceback.format_exc()[-1500:]


def run(role: str, index: int, spec: dict, ready, start, results) -> None:
    """Register the board, report ready, wait for the common start, then work for `spec["seconds"]`."""
    out: dict = {"role": role, "index": index, "ok": 0, "gone": [], "errors": [], "deleted": []}
    try:
        board = _board(spec, f"{spec['cache']}/{role}-{index}")
        from pinstorm.boards.errors import VersionNotFound
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which fails the test
        out["errors"].append(("startup", traceback.format_exc()[-2000:]))
        ready.put(index)
        results.put(out)
        raise SystemExit(1) from e
    ready.put(index)
    start.wait(120)
    deadline = time.monotonic() + spec["seconds"]
    rng = random.Random(index)
    grace = {"grace": spec["grace"]} if "grace" in spec else {}  # the writers' protection (opt-in)
    i = 0
    while time.monotonic() < deadline or (role == "pruner" and i < len(spec["ages"])):
        try:
            if role == "writer":
                value = {"writer": index, "i": i}
                got = board.pin(value, PIN)
                assert got == value, (got, value)
                out["ok"] += 1
                i += 1
            elif role == "reader":
                version = rng.choice(spec["seeded"][OLD])
                try:
                    paths = board.pin_get(OLD, version=version, files=True)
                except VersionNotFound as e:  # pruned before or while it was read: named, never bare
                    out["gone"].append((version, str(e)))
                else:
                    assert len(paths) == spec["files"], (version, len(paths))
                    out["ok"] += 1
            else:  # the pruner: OLD's versions go one by one (oldest first); PIN keeps its newest only
                if i < len(spec["ages"]):
                    days = (spec["ages"][i] - 50) / 86400  # the i oldest seeded versions are older than this
                    out["deleted"] += [(OLD, v) for v in board.pin_versions_prune(OLD, days=days, **grace)]
                out["deleted"] += [(PIN, v) for v in board.pin_versions_prune(PIN, n=1, **grace)]
                time.sleep(spec["seconds"] / (2 * len(spec["ages"])))
                out["ok"] += 1
                i += 1
        except Exception as e:  # noqa: BLE001 - every failure is reported, the test names them
            out["errors"].append(_error(e))
    results.put(out)
