"""mirrorgate's version, from the installed package's metadata.

pyproject.toml is the one place it is set; the CLI (``--version``),
``/readyz`` and the ``mirrorgate_build_info`` metric read it from here.
"""

from importlib import metadata

__all__ = ["VERSION"]

VERSION = metadata.version("mirrorgate")
