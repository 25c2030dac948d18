"""gpupool's Python SDK and the ``gpupool-cli`` command line: submit, watch and cancel jobs, read quotas and
nodes, over the REST API. No Django: it talks HTTP to a gpupool server.

    from gpupool_client import Client

    with Client.from_config() as pool:
        print(pool.submit(spec).job.id)
"""

__version__ = "0.1.0"

from gpupool_client.client import Client, Pages, SubmitResult
from gpupool_client.errors import (
    ApiError,
    AuthError,
    ConfigError,
    GpupoolError,
    NetworkError,
    NotFoundError,
    RefusedError,
    ServerError,
)

__all__ = [
    "ApiError",
    "AuthError",
    "Client",
    "ConfigError",
    "GpupoolError",
    "NetworkError",
    "NotFoundError",
    "Pages",
    "RefusedError",
    "ServerError",
    "SubmitResult",
    "__version__",
]
