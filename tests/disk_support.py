"""A small real disk for tests of full disks: a tmpfs mounted for the test (root only; the test skips
where mounting is not allowed) and unmounted afterwards."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest


@pytest.fixture
def small_disk():
    """`small_disk(path, "1m")` mounts a tmpfs of that size at `path` (created) and returns it."""
    mounted: list[Path] = []

    def mount(path: Path, size: str) -> Path:
        path.mkdir(parents=True)
        try:
            done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                                  capture_output=True, timeout=30)
        except (OSError, subprocess.SubprocessError) as e:
            pytest.skip(f"cannot mount a tmpfs here: {e}")
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode(errors='replace').strip()}")
        mounted.append(path)
        return path

    yield mount
    while mounted:
        subprocess.run(["umount", "-l", str(mounted.pop())], capture_output=True, timeout=30)
