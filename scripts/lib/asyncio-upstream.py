"""An upstream written in Python asyncio, for scripts/bench-adaptive.sh: an HTTP/1.1
server (keep-alive, Content-Length bodies) whose requests share a capacity of
CAPACITY requests at SERVICE seconds each, processor-sharing: with n requests in
service each advances at min(1, CAPACITY / n) of full speed, so past the capacity
every request slows down. Its service times jitter with the interpreter (the event
loop's wake-ups, the garbage collector), noise the project did not write.

Usage: python3 asyncio-upstream.py PORT [CAPACITY] [SERVICE_SECONDS]
"""

import asyncio
import sys
import time

TICK = 0.001


class Processor:
    """Requests in service, each with the work it still needs (seconds)."""

    def __init__(self, capacity, service):
        self.capacity, self.service = capacity, service
        self.active = {}  # future -> remaining work
        self.wake = asyncio.Event()

    async def serve(self):
        """Waits until a new request's work is done."""
        done = asyncio.get_running_loop().create_future()
        self.active[done] = self.service
        self.wake.set()
        await done

    async def run(self):
        last = time.monotonic()
        while True:
            if not self.active:
                self.wake.clear()
                await self.wake.wait()
                last = time.monotonic()
            await asyncio.sleep(TICK)
            now = time.monotonic()
            share = min(1.0, self.capacity / max(1, len(self.active))) * (now - last)
            last = now
            for done in list(self.active):
                self.active[done] -= share
                if self.active[done] <= 0:
                    del self.active[done]
                    if not done.done():
                        done.set_result(None)


async def connection(reader, writer, processor):
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            fields = {}
            for line in lines[1:]:
                name, _, value = line.partition(":")
                fields[name.strip().lower()] = value.strip()
            length = int(fields.get("content-length", "0"))
            if length:
                await reader.readexactly(length)
            await processor.serve()
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nok\n")
            await writer.drain()
            if fields.get("connection", "").lower() == "close":
                break
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def main():
    port = int(sys.argv[1])
    capacity = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    service = float(sys.argv[3]) if len(sys.argv) > 3 else 0.020
    processor = Processor(capacity, service)
    ticker = asyncio.create_task(processor.run())
    server = await asyncio.start_server(
        lambda r, w: connection(r, w, processor), "127.0.0.1", port, backlog=1024
    )
    async with server:
        await asyncio.gather(server.serve_forever(), ticker)


if __name__ == "__main__":
    asyncio.run(main())
