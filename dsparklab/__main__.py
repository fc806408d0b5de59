"""``python -m dsparklab``: the ``dsparklab`` command."""

from dsparklab.cli.app import main

if __name__ == "__main__":
    main()
