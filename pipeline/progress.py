"""Progress bars for long pipeline jobs: boards' bars (quiet off a terminal), or forced on/off on request."""

from __future__ import annotations

import contextlib
import os

_ENV = "PINSTORM_PROGRESS"


@contextlib.contextmanager
def progress(description: str, total: int, unit: str, enabled: bool | None = None):
    """Yield `advance(n)`. `enabled=None`: a bar only on a terminal (or with PINSTORM_PROGRESS=1);
    True or False force it on or off without changing the setting for anyone else."""
    if enabled is False:
        yield lambda n: None
        return
    try:
        from boards.progress import progress_bar
    except ImportError:   # boards not importable: stay quiet rather than fail the job
        yield lambda n: None
        return
    with contextlib.ExitStack() as stack:
        saved = os.environ.get(_ENV)
        if enabled:
            os.environ[_ENV] = "1"
        try:
            advance = stack.enter_context(progress_bar(description, total, unit=unit))
        finally:
            if enabled:   # the bar has read the setting when it started; put it back
                if saved is None:
                    os.environ.pop(_ENV, None)
                else:
                    os.environ[_ENV] = saved
        yield advance
