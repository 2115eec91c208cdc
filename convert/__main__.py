"""`python -m convert`: see convert/cli.py (and `python -m convert --help` for examples)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
