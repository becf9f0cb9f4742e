"""The credential store as admission and the reconciler see it: scoped by the policy.

A policy credential may say which part of a registry its login is for
(``credentials.NAME.registry: host[:port]/path``). That scope, not the store
entry's own key, becomes the key of the generated ``.dockerconfigjson``, so
one mirror host can carry one login per project: the kubelet sends the most
specific key that covers an image. Credentials the policy does not scope keep
the store's key.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from mirrorgate import policy
from mirrorgate.webhook.credentials.store import Credential, CredentialStore

__all__ = ["ScopedStore"]


class ScopedStore:
    """A :class:`CredentialStore` over another, with each login re-keyed to its policy scope."""

    def __init__(
        self, store: CredentialStore, grants: Callable[[], Mapping[str, policy.CredentialGrant]]
    ) -> None:
        self.store = store
        self._grants = grants
        # (store snapshot, grants) -> scoped snapshot. The inputs are held, not
        # just their ids, so an id is never reused while it is the cache key.
        self._cached: (
            tuple[Mapping[str, Credential], Mapping[str, Any], Mapping[str, Credential]] | None
        ) = None

    def __repr__(self) -> str:
        return f"ScopedStore({self.store!r})"

    def snapshot(self) -> Mapping[str, Credential]:
        """Memory only; recomputed when the store or the policy changed, else the same object."""
        base, grants = self.store.snapshot(), self._grants()
        cached = self._cached
        if cached is not None and cached[0] is base and cached[1] is grants:
            return cached[2]
        scoped = {name: _scoped(credential, grants.get(name)) for name, credential in base.items()}
        self._cached = (base, grants, scoped)
        return scoped

    def problem(self) -> str | None:
        return self.store.problem()

    def subscribe(self, callback: Callable[[], Any]) -> None:
        self.store.subscribe(callback)


def _scoped(credential: Credential, grant: policy.CredentialGrant | None) -> Credential:
    if grant is None or grant.registry is None:
        return credential
    return dataclasses.replace(credential, registry=str(grant.registry))
