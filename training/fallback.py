"""How a probe-and-fall-back choice is told, for TensorFlow's strategies (`strategy`) and torch's
backends (`torch_fit`) alike: one wording in the warning, the result's one-line description and
the lineage. No framework is imported here."""

from __future__ import annotations


def error_line(error: BaseException) -> str:
    """``Type: first line`` of an error (at most 300 characters), without TensorFlow's node and
    attribute dump: what a fallback warning and the recorded ``error`` keep of the failure."""
    lines = str(error).strip().splitlines()
    text = lines[0].split(" used by {{node", 1)[0] if lines else ""
    return f"{type(error).__name__}: {text[:300]}"


def probe_failure(failed: str, reason: str) -> str:
    """What failed its probe and the first line of why (the error raised when falling back is refused)."""
    return f"{failed} failed its all-reduce probe ({reason})"


def fallback_warning(failed: str, reason: str, fallback: str) -> str:
    """The WARNING a fallback logs: `probe_failure`, then what runs instead."""
    return f"{probe_failure(failed, reason)}; falling back to {fallback}"


def probe_outcome(fallback_from: str | None, error: str | None, probe_seconds: float | None) -> str:
    """The end of a choice's ``describe()``: the fallback (if any) and the probe that passed."""
    text = f" (fell back from {fallback_from}: {error})" if fallback_from else ""
    if probe_seconds is not None:
        text += f"; all-reduce probe passed in {probe_seconds:.2f} s"
    return text
