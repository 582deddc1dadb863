"""``ezflow perf``: the benchmark suites, their runner, results, comparison and report.

Layout (one module per concern):

* :mod:`._spec` — suites (p2p: the program users write, 1 -> 1, and its variants; the
  graph suites), transports, sizes, plans and the process layout of each cell;
* :mod:`._worker` — the child processes (graph server, sources, relays, sinks), written
  against a small :class:`~._worker.Framework` adapter so that a peer framework's
  worker runs the very same measurement on that framework;
* :mod:`._floor` — the raw floor of the machine (socketpair round trip, one copy of
  each size, memcpy bandwidth; for p2p, paced one-way and stream rate on a raw socket);
* :mod:`._environment` — what the figures were measured on;
* :mod:`._runner` — spawns the processes of every cell, retries and counts crashes,
  collects and aggregates;
* :mod:`._schema` — the documented JSON schema of a results file and its validator;
* :mod:`._noise` — a figure as the median of its rounds with their spread, and when a
  difference is a change ("no change" inside the noise);
* :mod:`._compare`, :mod:`._report` — ratios between runs, self-contained HTML report;
* :mod:`._waterfall` — the same scenarios at two git refs, in alternating rounds;
* :mod:`._peers` — the peer frameworks, their venvs, ``ezflow perf peers`` and its
  ``--selfcheck`` against each library's own examples.

Importing this package is cheap (no rich, no typer): worker processes import it.
"""
