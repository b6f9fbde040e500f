#!/usr/bin/env python3
"""A TCP proxy on 127.0.0.1 that adds a fixed latency to every request, for benchmarks of reading
from a store over a network (BENCHMARKS.md, issue 30).

    python3 scripts/latency-proxy.py LISTEN_PORT UPSTREAM_PORT MILLISECONDS [PROCESSES]

Each chunk a client sends is held MILLISECONDS before it goes on to the server, so every HTTP
request waits that long once; responses flow back at full speed. PROCESSES (default: the cores,
at most 8) share the port (SO_REUSEPORT): one Python process forwards about 0.7 GB/s. Ends on
SIGINT or SIGTERM.
"""
import asyncio
import os
import signal
import sys


async def pipe(reader, writer, delay):
    try:
        while True:
            data = await reader.read(1 << 20)
            if not data:
                break
            if delay:
                await asyncio.sleep(delay)
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        try:
            writer.close()
        except Exception:
            pass


async def main(listen, upstream, delay):
    async def serve(cr, cw):
        try:
            sr, sw = await asyncio.open_connection("127.0.0.1", upstream)
        except OSError:
            cw.close()
            return
        await asyncio.gather(pipe(cr, sw, delay), pipe(sr, cw, 0))

    server = await asyncio.start_server(serve, "127.0.0.1", listen, backlog=512, reuse_port=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for s in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(s, stop.set)
    async with server:
        await stop.wait()


if __name__ == "__main__":
    listen, upstream, ms = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    procs = int(sys.argv[4]) if len(sys.argv) > 4 else min(os.cpu_count() or 1, 8)
    children = []
    for _ in range(procs - 1):
        pid = os.fork()
        if pid == 0:
            asyncio.run(main(listen, upstream, ms / 1000.0))
            os._exit(0)
        children.append(pid)
    try:
        asyncio.run(main(listen, upstream, ms / 1000.0))
    finally:
        for pid in children:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
