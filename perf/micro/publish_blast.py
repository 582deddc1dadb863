"""perf/micro/publish_path.py in the regime of a publishing loop that does not sleep (a
blast): every message after the first of a loop turn is queued and written with the
turn's others. Under callgrind (~50x slower) every message would look paced to
StreamLink (PACED_GAP_NS after the last write) and be written at once, so this script
raises the gap for StreamLink: the instruction counts are those of the real blast.

    python perf/micro/publish_blast.py                     (ns per message, best of 5)

EZ_ONCE=1 runs once and N=... sets the messages (callgrind: instructions per message are
the difference of two runs over the difference of their N; /tmp-free recipe in
docs/architecture.md, "The compiled hot path"). Compare trees: PYTHONPATH=TREE python ...
"""
import os, runpy

import ezflow._transports._stream_publish as stream_publish

stream_publish._PACED_GAP_NS = 1 << 62  # (every message of a turn after the first: a burst)
runpy.run_path(os.path.join(os.path.dirname(__file__), "publish_path.py"), run_name="__main__")
