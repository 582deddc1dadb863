"""The paced receive cycle in one process, on the stock asyncio loop: a socketpair
feeds one 64 B ordinary DATA frame (from a callback) while a task awaits ``recv`` on a ChannelConnection
(read callback -> channel -> inbox -> the task's wake-up -> recv returns, then its
release and ACK). Prints CPU per cycle (process_time, the best of 5 runs).

    python perf/micro/paced_cycle.py [N]        (EZ_ONCE=1: one run, for callgrind:
    instructions per cycle are the difference of two runs over the difference of N)

Compare two trees with the same interpreter: PYTHONPATH=/path/to/tree python ..."""
import asyncio, os, socket, sys, time
import numpy as np
from ezflow._core._codec import Codec
from ezflow._core._channel import Channel
from ezflow._core._inbox import Inbox
from ezflow._core._framing import DATA_PREFIX, DATA
from ezflow._core._protocol import PublisherInfo
from ezflow._transports._stream_frames import HEADER_SIZE
from ezflow._transports._stream_channel import ChannelConnection
from ezflow._graph._subscriber import Subscriber

N = int(sys.argv[1]) if len(sys.argv) > 1 else 20000

async def main():
    loop = asyncio.get_running_loop()
    body = Codec().encode((0, 1, 2, np.zeros(16, np.float32))).to_bytes()
    best = 1e9
    for rep in range(1 if os.environ.get("EZ_ONCE") else 5):
        ours, theirs = socket.socketpair()
        theirs.setblocking(False)
        channel = Channel("p-1", "/t", Codec(), transport="shm")
        inbox = Inbox()
        channel.attach(inbox)
        info = PublisherInfo("p-1", "/t", "c-1", "h-1", 1, ("127.0.0.1", 1))
        conn = ChannelConnection(channel, info, max_size=1 << 16, on_lost=lambda: None)
        await loop.create_unix_connection(lambda: conn, sock=ours)
        channel.on_release, conn._ack_every, conn._ack_bytes = conn._on_release, 16, 1 << 20
        recv = Subscriber("s-1", "/t", inbox, "shm", lambda _: asyncio.sleep(0)).recv
        send = theirs.send
        t = time.process_time()
        for seq in range(1, N + 1):
            # (sent by a callback once the task waits and its release and ACK are done,
            # as a paced frame arrives at an idle loop)
            loop.call_soon(send, DATA_PREFIX.pack(HEADER_SIZE + len(body), DATA, 0, seq, 0, 0) + body)
            await recv()
            for _ in range(3):
                await asyncio.sleep(0)
            if not seq % 256:
                try:
                    while theirs.recv(1 << 16):  # (the ACKs)
                        pass
                except BlockingIOError:
                    pass
        best = min(best, (time.process_time() - t) / N)
        conn.welcome.cancel()
        conn.close()
        theirs.close()
    print(f"{best*1e6:.2f} us CPU per paced receive cycle")

with asyncio.Runner(loop_factory=asyncio.new_event_loop) as runner:
    runner.run(main())
