"""A TCP proxy on a loopback port that a test can cut (every connection closed, new ones refused) and restore: a
network fault between one process and a service such as Redis, the rest of the test still reaching the service."""

from __future__ import annotations

import asyncio
import contextlib
import threading


class CuttableProxy:
    def __init__(self, host: str, port: int):
        self.target = (host, port)
        self.port = 0
        self.is_cut = False
        self.cuts = 0  # connections closed or refused while cut
        self.writers: set[asyncio.StreamWriter] = set()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="tcp-proxy")

    def start(self) -> CuttableProxy:
        self.thread.start()
        self.server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._serve, "127.0.0.1", 0), self.loop).result(10)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        async def shutdown():
            self.cut()
            self.server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(shutdown(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    def cut(self) -> None:
        def close_all():
            self.is_cut = True
            for writer in list(self.writers):
                self.cuts += 1
                writer.close()
            self.writers.clear()
        self.loop.call_soon_threadsafe(close_all)

    def restore(self) -> None:
        self.loop.call_soon_threadsafe(setattr, self, "is_cut", False)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.is_cut:
            self.cuts += 1
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self.writers |= {writer, up_writer}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, asyncio.CancelledError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            for w in (writer, up_writer):
                self.writers.discard(w)
                w.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
