"""The raw baseline: one process, aiohttp, the same requests at the same concurrency.

Each request is what the worker sends: a JSON POST with the API key header and an
X-Toolrelay-Invocation id, whose JSON answer is read and parsed.

Run: ``python -m bench.raw URL N CONCURRENCY`` prints one JSON line with the timings.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid

import aiohttp

from bench.constants import REQUEST_TIMEOUT_S, call_headers


async def run(url: str, n: int, concurrency: int) -> dict[str, float | int]:
    next_index = iter(range(1, n + 1))
    errors = 0
    first_start = 0.0
    last_end = 0.0
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def lane() -> None:
            nonlocal errors, first_start, last_end
            for i in next_index:
                headers = call_headers(str(uuid.uuid4()))
                first_start = first_start or time.time()
                try:
                    async with session.post(url, json={"n": i}, headers=headers) as resp:
                        body = await resp.read()
                        json.loads(body)
                        if resp.status != 200:
                            errors += 1
                except (aiohttp.ClientError, TimeoutError, ValueError):
                    errors += 1
                last_end = time.time()

        await asyncio.gather(*(lane() for _ in range(concurrency)))
    elapsed = last_end - first_start
    return {
        "n": n,
        "errors": errors,
        "first_start": first_start,
        "last_end": last_end,
        "elapsed_s": elapsed,
        "per_s": n / elapsed if elapsed > 0 else 0.0,
    }


if __name__ == "__main__":
    target, count, lanes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    print(json.dumps(asyncio.run(run(target, count, lanes))), flush=True)
