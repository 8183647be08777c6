"""``python -m convergent``: the same as the ``convergent`` command."""

import sys

from convergent.cli import main

sys.exit(main())
