"""``python -m bench.peer_worker DB_URL UPSTREAM_URL CONCURRENCY``: the procrastinate worker.

A module of its own so that the procrastinate App is not created in ``__main__``.
"""

from __future__ import annotations

import asyncio
import sys

from bench.peer import work

if __name__ == "__main__":
    asyncio.run(work(sys.argv[1], sys.argv[2], int(sys.argv[3])))
