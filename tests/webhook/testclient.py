"""Starlette's TestClient, imported without its httpx deprecation warning.

Starlette 1.x warns when its TestClient runs on ``httpx`` instead of
``httpx2``; the project's dev dependencies pin ``httpx`` (also the HTTPS
client of the real-server tests), and warnings are errors in pytest. Drop this
module when the dev dependencies move to ``httpx2``.
"""

from __future__ import annotations

import warnings

from starlette.exceptions import StarletteDeprecationWarning

with warnings.catch_warnings():
    warnings.simplefilter("ignore", StarletteDeprecationWarning)
    from starlette.testclient import TestClient

__all__ = ["TestClient"]
