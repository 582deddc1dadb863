"""What the read size costs a tcp receiver: two threads of one process on a loopback
tcp pair, one ``sendall`` of 1 MiB a message, the other ``recv_into`` one buffer in
reads of at most CHUNK bytes; CPU a message of each thread (``time.thread_time``).

    python perf/micro/tcp_read_size.py CHUNK      # e.g. 65536, 262144, 1048576

(issue 28: 64 KiB reads cost the reader about twice what whole-message reads do.)
"""

import socket
import sys
import threading
import time

import numpy as np

N = 3000
SIZE = 1 << 20
chunk = int(sys.argv[1])
server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen()
sender = socket.create_connection(server.getsockname())
receiver, _ = server.accept()
source = np.random.default_rng().integers(0, 256, SIZE, dtype=np.uint8)
result = {}


def send() -> None:
    for i in range(N + 200):
        if i == 200:
            start = time.thread_time()
        sender.sendall(source)
    result["send"] = 1e6 * (time.thread_time() - start) / N
    sender.shutdown(socket.SHUT_WR)


thread = threading.Thread(target=send)
thread.start()
view = memoryview(np.empty(SIZE, np.uint8))
reads = 0
for k in range(N + 200):
    if k == 200:
        cpu, wall, reads = time.thread_time(), time.perf_counter(), 0
    filled = 0
    while filled < SIZE:
        filled += receiver.recv_into(view[filled : filled + chunk])
        reads += 1
receive = 1e6 * (time.thread_time() - cpu) / N
rate = N / (time.perf_counter() - wall)
thread.join()
print(
    f"chunk {chunk}: receiver {receive:.1f} sender {result['send']:.1f} us/msg, "
    f"{reads / N:.1f} reads/msg, {rate:.0f} msgs/s"
)
