"""The peer frameworks of ``ezflow perf peers``: each one a worker module run in its own
virtualenv, never imported by ezflow itself.

* :mod:`._ezmsg`, :mod:`._pyzmq`, :mod:`._zenoh`, :mod:`._iceoryx2` — a
  :class:`~ezflow._perf._worker.Framework` each, run as ``VENV/bin/python -m
  ezflow._perf._peers._NAME`` (they import their library at the top: only the peer's
  venv can import them);
* :mod:`._common` — what the peers without a graph server share (a rendezvous, the
  wire layout of a ``(phase, seq, t_ns, payload)`` tuple);
* :mod:`._install` — the venvs, made on demand from PyPI;
* :mod:`._command` — ``ezflow perf peers``: runs ezflow's ordinary p2p program next to
  every peer and prints one table.

Importing this package imports nothing else (workers of every peer import it).
"""
