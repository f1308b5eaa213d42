"""The loopback rule of the tools that talk to a server (bench, the monitoring picture): 127.0.0.1 only."""

from __future__ import annotations

import re

from pipeline.core.errors import BenchError

LOCAL_HOSTS = ("127.0.0.1", "localhost", "[::1]")


def check_local(url: str) -> None:
    """Raises:
        BenchError: `url` names a host other than this one's loopback.
    """
    host = re.sub(r"^[a-z]+://", "", url).split("/")[0]
    host = host.rsplit(":", 1)[0] if not host.startswith("[") else host.split("]")[0] + "]"
    if host not in LOCAL_HOSTS:
        raise BenchError(f"bench only talks to 127.0.0.1, not {host!r}; run it on the serving host")
