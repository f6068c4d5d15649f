"""``python -m jaxstow``: the ``jaxstow`` command line."""

from jaxstow.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
