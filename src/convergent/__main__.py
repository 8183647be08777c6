"""``python -m convergent``: the same as the ``convergent`` command."""

import sys

from convergent.cli import main

if __name__ == "__main__":  # spawned worker processes import this module too
    sys.exit(main())
