"""mirrorgate: one import name for the three packages.

The source tree keeps ``policy/``, ``webhook/`` and ``certs/`` at the top, as
the design lays them out; the entries in this folder are links to them, so
that the tools that read source (pytest, mypy, import-linter, ruff) and an
installed wheel all see the same names: ``mirrorgate.policy``,
``mirrorgate.webhook`` and ``mirrorgate.certs``. Nothing else is installed at
the top of site-packages: ``policy``, ``webhook`` and ``certs`` are generic
names that other distributions use.
"""
