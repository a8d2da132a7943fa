"""A real Spark standalone cluster on 127.0.0.1: one master and N workers, started with pyspark's own
``bin/spark-class`` and always stopped.

Each daemon runs in its own process group, so stopping it also ends the executor JVMs and Python
workers it started, and it is killed by the kernel if the test process dies first (no orphaned
JVMs after a crashed or killed test run). Nothing listens beyond loopback: ``SPARK_LOCAL_IP`` and
``--host`` are 127.0.0.1, web UIs take free ports, the REST submission server is off.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from .lifecycle import LocalServer

HOST = "127.0.0.1"


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


class _Daemon:
    """One ``spark-class`` JVM whose output is kept in memory (a reader thread, so pipes never fill)."""

    def __init__(self, name: str, args: list[str], env: dict):
        self.name = name
        self.lines: list[str] = []
        self.process = subprocess.Popen([str(spark_home() / "bin" / "spark-class"), *args], env=env,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                        preexec_fn=_own_group_dying_with_parent)
        self._reader = threading.Thread(target=self._read, name=f"spark-{name}-log", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, pattern: str, timeout: float) -> re.Match:
        deadline = time.monotonic() + timeout
        seen = 0
        while time.monotonic() < deadline:
            while seen < len(self.lines):
                match = re.search(pattern, self.lines[seen])
                seen += 1
                if match:
                    return match
            if self.process.poll() is not None:
                break
            time.sleep(0.1)
        raise RuntimeError(f"spark {self.name} did not log {pattern!r} within {timeout} s (exit code "
                           f"{self.process.poll()}):\n" + "\n".join(self.lines[-40:]))

    def descendants(self) -> list[int]:
        """Process ids started under this daemon (executor JVMs, Python daemons and workers)."""
        return [pid for pid in _children_tree(self.process.pid) if pid != self.process.pid]

    def stop(self, grace: float = 10.0) -> None:
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.process.wait(wait)
            except subprocess.TimeoutExpired:
                continue
            # the JVM is gone; anything it started in its group goes too
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            break
        self._reader.join(5)


def _own_group_dying_with_parent() -> None:
    """In the child before exec: a process group of its own (stopped as one), and SIGKILL if the test
    process dies without stopping it (Linux PR_SET_PDEATHSIG survives exec). Executors of a standalone
    worker exit by themselves when their worker is gone, and their Python workers with them."""
    os.setsid()
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)    # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _parents() -> dict[int, int]:
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    return parents


def _children_tree(root: int) -> list[int]:
    parents = _parents()
    tree, frontier = [root], [root]
    while frontier:
        frontier = [pid for pid, parent in parents.items() if parent in frontier]
        tree += frontier
    return tree


def cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


class StandaloneCluster(LocalServer):
    """``with StandaloneCluster(workers=2, cores=1) as cluster:`` -> ``cluster.master_url`` is spark://127.0.0.1:P."""

    def __init__(self, workers: int = 2, cores: int = 1, memory: str = "1g", timeout: float = 90.0):
        self.workers, self.cores, self.memory, self.timeout = workers, cores, memory, timeout
        self.master: _Daemon | None = None
        self.worker_daemons: list[_Daemon] = []
        self.master_url = ""
        self._dir: tempfile.TemporaryDirectory | None = None

    def _env(self) -> dict:
        conf_dir = Path(self._dir.name) / "conf"
        conf_dir.mkdir(exist_ok=True)
        env = {**os.environ, "SPARK_HOME": str(spark_home()), "SPARK_LOCAL_IP": HOST, "SPARK_LOCAL_HOSTNAME": HOST,
               "SPARK_CONF_DIR": str(conf_dir), "SPARK_MASTER_HOST": HOST, "PYSPARK_PYTHON": sys.executable,
               "SPARK_WORKER_DIR": str(Path(self._dir.name) / "work"),
               # no REST submission server (it takes the fixed port 6066)
               "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
               # the master and worker JVMs start quickly, as the tests' drivers do (tests/conftest.py)
               "SPARK_DAEMON_JAVA_OPTS": "-XX:TieredStopAtLevel=1",
               # executors never touch the user's pinstorm state either
               "PINSTORM_CACHE": str(Path(self._dir.name) / "pinstorm-cache"),
               "PINSTORM_CONFIG": str(Path(self._dir.name) / "pinstorm-config" / "boards.yaml"),
               "PINSTORM_BOARD": str(Path(self._dir.name) / "pinstorm-board")}
        env.pop("PYTHONPATH", None)
        return env

    def start(self) -> "StandaloneCluster":
        self._dir = tempfile.TemporaryDirectory(prefix="pinstorm-spark-")
        env = self._env()
        try:
            self.master = _Daemon("master", ["org.apache.spark.deploy.master.Master", "--host", HOST, "--port", "0",
                                             "--webui-port", "0"], env)
            port = self.master.wait_for(r"Starting Spark master at spark://[^:]+:(\d+)", self.timeout).group(1)
            self.master_url = f"spark://{HOST}:{port}"
            for index in range(self.workers):
                self.worker_daemons.append(_Daemon(f"worker{index}", [
                    "org.apache.spark.deploy.worker.Worker", "--host", HOST, "--port", "0", "--webui-port", "0",
                    "--cores", str(self.cores), "--memory", self.memory,
                    "--work-dir", str(Path(self._dir.name) / f"work{index}"), self.master_url], env))
            for daemon in self.worker_daemons:
                daemon.wait_for(r"Successfully registered with master", self.timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for daemon in [*self.worker_daemons, *([self.master] if self.master else [])]:
            daemon.stop()
        self.worker_daemons, self.master = [], None
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def python_task_pids(self) -> list[int]:
        """Python processes running a task: children of an executor's ``pyspark.daemon``."""
        pids = []
        for daemon in self.worker_daemons:
            tree = daemon.descendants()
            daemons = {pid for pid in tree if "pyspark.daemon" in " ".join(cmdline(pid))}
            parents = _parents()
            pids += [pid for pid in tree if parents.get(pid) in daemons]
        return pids


def serve(workers: int = 2, cores: int = 1):
    """A generator to turn into a pytest fixture: yields a started cluster, stops it afterwards."""
    with StandaloneCluster(workers=workers, cores=cores) as cluster:
        yield cluster
