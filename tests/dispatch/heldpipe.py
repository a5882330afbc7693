"""A loopback pipe to PostgreSQL that can hold the server's answer: the query has run and
committed, and the client has not heard so yet. For the moment no lock or delay on the
server reaches: between a COMMIT and the client reading it. Or, ``drop``, cut the
connection that sent the query (once), as a database restart or a lost link does."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from psycopg import conninfo

CHUNK = 65536


class HeldPipe:
    """Forwards every connection to the database; once a client sends a query holding
    ``marker``, that connection's answers wait until ``release``. ``held`` is set then."""

    def __init__(self, marker: bytes, drop: bool = False) -> None:
        self.marker, self.drop = marker, drop
        self.held = asyncio.Event()
        self._released = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()

    def release(self) -> None:
        self._released.set()

    async def _connection(
        self, target: dict[str, Any], reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        host, port = target.get("host") or "127.0.0.1", int(target.get("port") or 5432)
        if host.startswith("/"):  # the embedded server listens on a socket in a directory
            up_reader, up_writer = await asyncio.open_unix_connection(f"{host}/.s.PGSQL.{port}")
        else:
            up_reader, up_writer = await asyncio.open_connection(host, port)
        marked = asyncio.Event()

        async def upwards() -> None:
            tail = b""  # a marker may straddle two reads
            while data := await reader.read(CHUNK):
                seen, tail = tail + data, data[-len(self.marker) :]
                if self.marker in seen and not self._released.is_set():
                    if self.drop:  # cut before the query reaches the server
                        self.held.set()
                        self._released.set()
                        break
                    marked.set()
                up_writer.write(data)
                await up_writer.drain()
            up_writer.close()
            writer.close()

        async def downwards() -> None:
            while data := await up_reader.read(CHUNK):
                if marked.is_set() and not self._released.is_set():
                    self.held.set()
                    await self._released.wait()
                writer.write(data)
                await writer.drain()
            writer.close()

        with contextlib.suppress(ConnectionError):
            await asyncio.gather(upwards(), downwards())
        writer.close()
        up_writer.close()


@contextlib.asynccontextmanager
async def held_pipe(
    database_url: str, marker: bytes, drop: bool = False
) -> AsyncIterator[tuple[HeldPipe, str]]:
    """The pipe and a URL of the same database through it (in this event loop)."""
    pipe = HeldPipe(marker, drop)
    target = conninfo.conninfo_to_dict(database_url)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        pipe._tasks.add(task)
        try:
            await pipe._connection(target, reader, writer)
        finally:
            pipe._tasks.discard(task)

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        url = conninfo.make_conninfo(database_url, host="127.0.0.1", port=port, sslmode="disable")
        yield pipe, url  # no TLS: the pipe reads the queries
    finally:
        pipe.release()
        server.close()
        for task in list(pipe._tasks):
            task.cancel()
        await server.wait_closed()
