"""The publish path of a tcp/shm publisher in one process, no socket: the ordinary 64 B
tuple `(phase, seq, t_ns, float32[16])` through `await Publisher.publish` -> Outlet ->
StreamLink (its writes go to a sink that releases what it gets, as the channel's ACK
would). Prints ns per message, the best of 5 runs.

    python perf/micro/publish_path.py

Compare two trees with the same interpreter: PYTHONPATH=/path/to/tree python ...
EZ_ONCE=1 runs once and N=... sets the messages (for callgrind: instructions per
message are the difference of two runs, N=6400 and N=25600, over 19200)."""
import asyncio, os, time
import numpy as np
from ezflow._core._codec import Codec
from ezflow._core._outlet import Outlet
from ezflow._transports._stream_publish import StreamLink
from ezflow._graph._publisher import Publisher

N = int(os.environ.get("N", 64 * 1000))


class Sink:
    """The write half: every write releases what was sent (the channel's ACK)."""
    link: StreamLink | None = None

    def write(self, data):
        self.release()

    def writelines(self, parts):
        self.release()

    def release(self):
        link = self.link
        link.released(link.sent_count, link.sent_bytes)

    def is_closing(self):
        return False


class Connection:
    def __init__(self):
        self.out = Sink()


async def main():
    body = np.zeros(16, np.float32)
    best = 1e9
    for rep in range(1 if os.environ.get("EZ_ONCE") else 5):
        outlet = Outlet("p-1", "/t", Codec(), max_in_flight=64, max_in_flight_bytes=1 << 20)
        connection = Connection()
        link = connection.out.link = StreamLink(connection, lossless=True, max_size=1 << 20)
        outlet.add_link(link)

        async def close(_):
            pass

        pub = Publisher(outlet, None, close)
        publish = pub.publish
        t = time.perf_counter()
        for seq in range(N):
            await publish((0, seq, time.perf_counter_ns(), body))
        best = min(best, (time.perf_counter() - t) / N)
    print(f"{best*1e9:.0f} ns/msg (publish)")


asyncio.run(main())
