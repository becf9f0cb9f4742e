"""Everything behind a CLI verb, one module per verb or group of peers: serve, audit, export,
offline (rewrite, explain, policy check), credentials, certs. Each module holds its commands'
run functions; ``webhook.cli`` builds the parser and dispatches to them.

The top layer: commands may use every other part of the webhook; nothing below imports them.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TextIO

__all__ = ["EXIT_FINDINGS", "EXIT_OK", "EXIT_USAGE", "Command"]

# Exit statuses, for every command (the CLI's contract, see webhook.cli).
EXIT_OK, EXIT_FINDINGS, EXIT_USAGE = 0, 1, 2

Command = Callable[[argparse.Namespace, TextIO, TextIO], int]
"""A command's run function: parsed arguments, stdout, stderr in; exit status out."""
