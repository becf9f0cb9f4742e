"""Work for a request stops when its client has gone: nobody is left to take the answer.

A review queued for the worker process (:mod:`webhook.edge.offload`) may
wait behind others for seconds. If its connection is closed meanwhile (the
client left, or the connection table closed it for a budget or a timeout),
its answer can never be sent, yet it would still take its turn and the
worker's time from the reviews queued behind it: clients closed for not
reading, reconnecting and sending again, queued dead reviews faster than the
worker could decode them, and a legitimate review waited behind all of them.

:class:`~webhook.edge.protocol.LimitedHttpProtocol` puts an event in each
request's scope (extension :data:`GONE`, key ``event``) that is set when the connection is
lost; :func:`unless_gone` runs the work until then.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from starlette.types import Scope

__all__ = ["GONE", "ClientGone", "event", "unless_gone"]

_T = TypeVar("_T")

GONE = "mirrorgate.gone"
"""The scope extension holding the connection's :class:`asyncio.Event`."""


class ClientGone(Exception):
    """The request's connection closed before its answer: send nothing."""


def event(scope: Scope) -> asyncio.Event | None:
    """The event set when the request's connection is lost (None: a server without it)."""
    found = scope.get("extensions", {}).get(GONE, {}).get("event")
    return found if isinstance(found, asyncio.Event) else None


async def unless_gone(gone: asyncio.Event | None, work: Coroutine[Any, Any, _T]) -> _T:
    """``work``'s result; cancelled, raising :class:`ClientGone`, if ``gone`` is set first."""
    if gone is None:
        return await work
    if gone.is_set():
        work.close()
        raise ClientGone
    task = asyncio.ensure_future(work)
    waiter = asyncio.ensure_future(gone.wait())
    try:
        await asyncio.wait((task, waiter), return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        waiter.cancel()
    if task.done():
        return task.result()
    task.cancel()
    task.add_done_callback(_retrieved)
    raise ClientGone


def _retrieved(task: asyncio.Future[Any]) -> None:
    # What the abandoned work raised as it was cancelled is nobody's to handle.
    if not task.cancelled():
        task.exception()
