"""``python -m ezflow``: the same as the ``ezflow`` command."""

from ezflow._cli._app import main

if __name__ == "__main__":
    main()
