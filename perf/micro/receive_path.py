"""The receive path of a tcp/shm channel in one process, no socket: 64 B ordinary
tuples in reads of BATCH frames (default 64; 1 is a paced stream) -> ChannelConnection
-> channel -> inbox -> `await sub.recv()`. Prints ns per message, the best of 5 runs.

    BATCH=64 python perf/micro/receive_path.py

Compare two trees with the same interpreter: PYTHONPATH=/path/to/tree python ...
EZ_ONCE=1 runs once, N=... sets the messages (for callgrind: instructions per message
are the difference of two runs, N=6400 and N=25600, over 19200)."""
import asyncio, os, sys, time
import numpy as np
from ezflow._core._codec import Codec
from ezflow._core._channel import Channel
from ezflow._core._inbox import Inbox
from ezflow._core._framing import DATA_PREFIX, DATA
from ezflow._transports._stream_frames import HEADER_SIZE
from ezflow._core._protocol import PublisherInfo
from ezflow._transports._stream_channel import ChannelConnection
from ezflow._graph._subscriber import Subscriber

BATCH = int(os.environ.get("BATCH", "64")); N = int(os.environ.get("N", 64 * 1000))
async def main():
    codec = Codec()
    body = np.zeros(16, np.float32)
    frames = []
    for seq in range(1, BATCH + 1):
        b = codec.encode((0, seq, time.perf_counter_ns(), body)).to_bytes()
        frames.append(DATA_PREFIX.pack(HEADER_SIZE + len(b), DATA, 0, seq, 0, 0) + b)
    read = b"".join(frames)
    best = 1e9
    for rep in range(1 if os.environ.get("EZ_ONCE") else 5):
        channel = Channel("p-1", "/t", Codec(), transport="tcp")
        inbox = Inbox()
        att = channel.attach(inbox)
        info = PublisherInfo("p-1", "/t", "c-1", "h-1", 1, ("127.0.0.1", 1))
        conn = ChannelConnection(channel, info, max_size=1 << 16, on_lost=lambda: None)
        # as after WELCOME with the default window (64): an ACK every 16 releases (the
        # connection has no transport: nothing is written)
        channel.on_release, conn._ack_every, conn._ack_bytes = conn._on_release, 16, 1 << 20
        # (the user's call: Subscriber.recv, as `await sub.recv()` makes it)
        get = Subscriber("s-1", "/t", inbox, "tcp", lambda _: asyncio.sleep(0)).recv
        t = time.perf_counter()
        for _ in range(N // BATCH):
            buf = conn.get_buffer(-1); buf[:len(read)] = read; conn.buffer_updated(len(read))
            for _ in range(BATCH):
                m = await get()
        best = min(best, (time.perf_counter() - t) / N)
    print(f"{best*1e9:.0f} ns/msg (batch {BATCH})")
asyncio.run(main())
