"""`python -m toolrelay.testing.postiz`: serve until SIGTERM/SIGINT.

Prints one JSON line on stdout once listening: base URLs, limits, and the seeded
organizations with their API keys and integration ids.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys

from ._ratelimit import DEFAULT_RATE_LIMIT, DEFAULT_RATE_WINDOW_SECONDS
from ._server import start_postiz


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m toolrelay.testing.postiz")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--front", action="store_true", help="serve behind a fake nginx front")
    parser.add_argument("--rate-limit", type=int, default=DEFAULT_RATE_LIMIT)
    parser.add_argument(
        "--rate-window", type=float, default=DEFAULT_RATE_WINDOW_SECONDS, help="seconds"
    )
    return parser.parse_args(argv)


async def serve(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    server = await start_postiz(
        host=args.host,
        port=args.port,
        front=args.front,
        rate_limit=args.rate_limit,
        rate_window_seconds=args.rate_window,
    )
    async with server:
        sys.stdout.write(json.dumps(server.describe()) + "\n")
        sys.stdout.flush()
        await stop.wait()


def main(argv: list[str] | None = None) -> None:
    asyncio.run(serve(parse_args(argv)))


if __name__ == "__main__":
    main()
