"""Per-epoch progress of a barrier training stage, sent from rank 0 back to the driver as it happens.

What executors print stays on the executors (a standalone worker writes it to log files in its work
dir), and Spark reports nothing on the driver until the stage ends, so a long fit was minutes of
silence between "2 workers on spark://..." and the final result. Rank 0 connects back to a small
TCP listener the driver opens on the address executors already reach it at (``spark.driver.host``;
127.0.0.1 for local runs) and sends one line per epoch; the driver hands each line to ``echo``
as it arrives. Every line carries a random token, so another process that finds the port cannot
print on the driver's console; lines are bounded and stripped of control characters.
Importing this module imports neither pyspark nor TensorFlow.
"""

from __future__ import annotations

import secrets
import socket
import threading
from typing import Callable

MAX_LINE = 1000            # bytes of one progress line; longer lines are cut


class ProgressListener:
    """``with ProgressListener(host, echo) as listener:`` -> ``listener.address`` ("host:port") and
    ``listener.token`` go to the tasks (see ``EpochReporter``); lines arrive at ``echo``."""

    def __init__(self, host: str, echo: Callable[[str], None]):
        self.echo, self.token = echo, secrets.token_hex(16)
        self._server = socket.create_server((host, 0))
        self._server.settimeout(0.2)
        self.address = f"{host}:{self._server.getsockname()[1]}"
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._accepting = threading.Thread(target=self._accept, name="pinstorm-spark-progress", daemon=True)

    def __enter__(self) -> "ProgressListener":
        self._accepting.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._accepting.join(5)
        for thread in self._threads:
            thread.join(1)
        self._server.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                connection, _ = self._server.accept()
            except (TimeoutError, socket.timeout):
                continue
            except OSError:
                return
            thread = threading.Thread(target=self._read, args=(connection,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _read(self, connection: socket.socket) -> None:
        prefix = self.token + " "
        connection.settimeout(0.5)
        with connection, connection.makefile("rb") as stream:
            while not self._stop.is_set():
                try:
                    raw = stream.readline(MAX_LINE + len(prefix) + 1)
                except (TimeoutError, socket.timeout):
                    continue
                except OSError:
                    return
                if not raw:
                    return
                line = raw.decode("utf-8", "replace").rstrip("\n")
                if not line.startswith(prefix):
                    return                                   # not one of our tasks: drop the connection
                text = "".join(ch for ch in line[len(prefix):] if ch.isprintable())[:MAX_LINE]
                try:
                    self.echo(text)
                except Exception:  # noqa: BLE001 - a failing echo must not kill the listener
                    pass


def send_line(address: str, token: str, text: str, timeout: float = 5.0) -> bool:
    """Send one progress line to the driver; False when it cannot be reached (training goes on)."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout) as connection:
            connection.sendall(f"{token} {text}\n".encode()[: MAX_LINE + len(token) + 2])
        return True
    except OSError:
        return False


def epoch_line(epoch: int, epochs: int | None, logs: dict | None, seconds: float) -> str:
    """``epoch 3/10: loss 0.412  accuracy 0.871  val_accuracy 0.850  (12.4 s)``."""
    metrics = "  ".join(f"{key} {value:.4g}" for key, value in (logs or {}).items()
                        if isinstance(value, (int, float)))
    total = f"/{epochs}" if epochs else ""
    return f"epoch {epoch + 1}{total}: {metrics}  ({seconds:.1f} s)".replace(":   (", ": (")


class EpochReporter:
    """A Keras callback for rank 0: one line per finished epoch to the driver's ``ProgressListener``."""

    def __new__(cls, address: str, token: str):
        import time

        from .keras_env import tensorflow

        tensorflow()                         # quietly, before tf_keras imports it
        import tf_keras as keras

        class Callback(keras.callbacks.Callback):
            def on_epoch_begin(self, epoch, logs=None):
                self._started = time.perf_counter()

            def on_epoch_end(self, epoch, logs=None):
                seconds = time.perf_counter() - getattr(self, "_started", time.perf_counter())
                send_line(address, token, epoch_line(epoch, self.params.get("epochs"), logs, seconds))

        return Callback()
