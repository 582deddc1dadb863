"""The peer frameworks of ``ezflow perf peers``: each one a worker module run in its own
virtualenv, never imported by ezflow itself.

* :mod:`._ezmsg`, :mod:`._pyzmq`, :mod:`._zenoh`, :mod:`._iceoryx2` — a
  :class:`~ezflow._perf._worker.Framework` each, written as the library's docs and
  examples write a lossless stream, run as ``VENV/bin/python -m
  ezflow._perf._peers._NAME [--flavour F]`` (they import their library at the top: only
  the peer's venv can import them); pyzmq and Zenoh have two flavours each;
* :mod:`._common` — what the peers without a graph server share (a rendezvous, the
  wire layout of a ``(phase, seq, t_ns, payload)`` tuple and its codec cached per
  stream, the flavours);
* :mod:`._examples` — each library's own throughput example (run in its venv);
* :mod:`._install` — the venvs, made on demand from PyPI;
* :mod:`._command` — ``ezflow perf peers``: runs ezflow's ordinary p2p program next to
  every peer and prints one table;
* :mod:`._selfcheck` — ``ezflow perf peers --selfcheck``: each library's example next to
  our worker on it.

Importing this package imports nothing else (workers of every peer import it).
"""
