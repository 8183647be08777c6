"""Rewrite ``src/convergent/cli_help.json``, the recorded parser that ``convergent --help``
replays (see ``convergent/cli_help.py``), after a command's flags or help texts changed.

    .venv/bin/python tools/record_cli_help.py
"""

from __future__ import annotations

from convergent.cli import add_commands, new_parser
from convergent.cli_help import write_record

if __name__ == "__main__":
    print(f"wrote {write_record(new_parser, add_commands)}")
