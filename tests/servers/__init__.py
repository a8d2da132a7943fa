"""Real servers on 127.0.0.1 for tests and benchmarks: S3 (moto), GCS (gcp-storage-emulator), Azure
Blob (Azurite, a Node.js process), a Kaggle-API look-alike, and a fault-injecting HTTP proxy to put in front of any of them.

Each server is a class with `start()` / `stop()` that is also a context manager, plus a `serve()`
generator that a test module turns into a pytest fixture with
`pytest.fixture(scope="module", name="s3_server")(s3.serve)`. Nothing here imports pytest, so
benchmarks use the same helpers.
"""

from .azurite import AzuriteServer
from .faults import FaultProxy
from .gcs import GcsServer
from .kaggle import KaggleServer
from .s3 import S3Server

__all__ = ["AzuriteServer", "FaultProxy", "GcsServer", "KaggleServer", "S3Server"]
