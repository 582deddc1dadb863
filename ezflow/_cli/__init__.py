"""The ``ezflow`` command line: one typer app (:mod:`._app`), one module per command
group registered on it."""
