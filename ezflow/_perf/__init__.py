"""``ezflow perf``: the benchmark suites, their runner, results, comparison and report.

Layout (one module per concern):

* :mod:`._spec` — suites, transports, sizes, plans and the process layout of each cell;
* :mod:`._worker` — the child processes (graph server, sources, relays, sinks), written
  against a small :class:`~._worker.Framework` adapter so that ``perf/peers/`` can run
  the very same measurement on another framework;
* :mod:`._floor` — the raw floor of the machine (socketpair round trip, memcpy);
* :mod:`._environment` — what the figures were measured on;
* :mod:`._runner` — spawns the processes of every cell, collects and aggregates;
* :mod:`._schema` — the documented JSON schema of a results file and its validator;
* :mod:`._compare`, :mod:`._report` — ratios between runs, self-contained HTML report.

Importing this package is cheap (no rich, no typer): worker processes import it.
"""
