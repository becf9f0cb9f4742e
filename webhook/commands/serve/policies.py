"""What `serve` serves as the policy: the policy file, and in a cluster the policy objects.

Without a cluster the policy is the file (``--policy``), as it always was. In a cluster it
is the ClusterMirrorPolicy and MirrorPolicy objects, composed by
:class:`~mirrorgate.webhook.cluster.policyobjects.PolicyObjects` with the file, when one
is given, as one more cluster object (the ConfigMap policy: deprecated, served for one
minor version more, with a warning in the log, a Warning Event on the ConfigMap and
``mirrorgate_policy_configmap_in_use``); the leader writes each object's status. Whatever
the source, :class:`ServedPolicy` is the one owner of the policy in force: the endpoints,
the credentials and the probes read it, and it tells its subscribers of every change.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from mirrorgate import policy
from mirrorgate.webhook import policyfile
from mirrorgate.webhook.background import Manager
from mirrorgate.webhook.cluster import kube, leader, policystate
from mirrorgate.webhook.cluster.optin import NamespaceOptIn
from mirrorgate.webhook.cluster.policyobjects import FILE_KEY, Composed, PolicyObjects
from mirrorgate.webhook.cluster.policystatus import PolicyStatus
from mirrorgate.webhook.commands.serve import reloaders
from mirrorgate.webhook.edge.metrics import Metrics
from mirrorgate.webhook.errors import ConfigError
from mirrorgate.webhook.logs import logger

__all__ = ["Cluster", "ServedPolicy"]

NO_FILE = "cluster objects"


def _no_file() -> policyfile.LoadedPolicy:
    """Before the objects are composed, with no file: nothing is rewritten (and /readyz
    says the objects are not composed yet)."""
    nothing = policy.compose([])
    return policyfile.LoadedPolicy(
        policy=nothing.cluster, composition=nothing, version="none", path=NO_FILE
    )


@dataclasses.dataclass(frozen=True)
class Cluster:
    """What the in-cluster components share: the Namespace cache (the pull secrets' opt-in,
    the grants by label) and the leader (who reconciles, refreshes and writes status)."""

    client: kube.Kube
    optin: NamespaceOptIn
    elector: leader.LeaderElector

    @classmethod
    def make(cls, client: kube.Kube, namespace: str, components: Manager) -> Cluster:
        made = cls(
            client, NamespaceOptIn(client), leader.LeaderElector(client, namespace=namespace)
        )
        components.add("namespace-opt-in", made.optin.informer)
        components.add("leader", made.elector)
        return made


class ServedPolicy:
    def __init__(
        self,
        path: str | None,
        *,
        client: kube.Kube | None,
        state: policystate.PolicyState | None,
        metrics: Metrics,
        interval: float,
    ) -> None:
        if path is None and client is None:
            raise ConfigError(
                "--policy FILE: required without a cluster (in one, the ClusterMirrorPolicy "
                "and MirrorPolicy objects are the policy)"
            )
        self._metrics, self._state = metrics, state
        self.file = (
            None
            if path is None
            else reloaders.PolicyFile(path, state=state, metrics=metrics, interval=interval)
        )
        self.loaded = self.file.loaded if self.file is not None else _no_file()
        self.refused = self.file.refused if self.file is not None else None
        self.objects: PolicyObjects | None = None
        self.status: PolicyStatus | None = None
        self._subscribers: list[reloaders.Publish] = []
        self._team_rules: tuple[
            policyfile.LoadedPolicy | None, Mapping[str, tuple[policy.MirrorRule, ...]]
        ] = (None, {})
        if self.file is not None:
            self.file.subscribe(self._file_published)

    def watch(self, cluster: Cluster) -> None:
        """In a cluster: serve the policy objects, composed with the file."""
        self.objects = PolicyObjects(
            cluster.client,
            file=self.file.loaded if self.file is not None else None,
            labels=cluster.optin.all_labels,
            publish=self._composed,
            file_yielded=self._file_yielded,
        )
        self.status = PolicyStatus(
            cluster.client, is_leader=cluster.elector.is_leader, stored=self.objects.stored
        )
        cluster.optin.subscribe(self.objects.namespaces_changed)
        if self.file is not None:
            self._metrics.policy_configmap.set(1)
            logger.warning(
                "policy file served beside the policy objects: deprecated",
                extra={"fields": {"file": self.file.path, "why": policystate.DEPRECATION}},
            )
            if self._state is not None:
                self._state.deprecated(self.file.path)

    def add_components(self, components: Manager) -> None:
        if self.objects is not None:
            components.add("policy-objects", self.objects)
        if self.status is not None:
            components.add("policy-status", self.status)
        if self.file is not None:
            components.add("policy-file", self.file)

    def problem(self) -> str | None:
        """Why the policy in force is not the cluster's yet (None: it is)."""
        return None if self.objects is None else self.objects.problem()

    def current(self) -> policy.Policy:
        """The cluster's policy in force now (one reference, replaced whole)."""
        return self.loaded.policy

    def policy_for(self, namespace: str) -> policy.Policy:
        """The policy in force now for ``namespace``: the cluster's with its MirrorPolicies."""
        return self.loaded.policy_for(namespace)

    def team_rules(self) -> Mapping[str, tuple[policy.MirrorRule, ...]]:
        """Each namespace's own rules now (its MirrorPolicies'): the probes probe their
        mirrors beside the cluster's. Made once per composition: they ask every round."""
        loaded = self.loaded
        if self._team_rules[0] is not loaded:
            self._team_rules = loaded, loaded.composition.team_rules  # one swap
        return self._team_rules[1]

    def subscribe(self, publish: reloaders.Publish) -> None:
        self._subscribers.append(publish)

    def _publish(self) -> None:
        for publish in self._subscribers:
            publish(self.loaded, self.refused)

    def _file_published(self, loaded: policyfile.LoadedPolicy, refused: str | None) -> None:
        self.refused = refused
        if self.objects is not None:
            self.objects.file_changed(loaded, refused)
            if loaded is self.objects.file:
                self._publish()  # only what /readyz says changed (a refused reload)
            return
        self.loaded = loaded
        self._publish()

    def _composed(self, composed: Composed) -> None:
        self.loaded = composed.loaded
        counts: dict[tuple[str, str], int] = {}
        for key, verdict in composed.verdicts.items():
            if key == FILE_KEY:
                continue
            found = (key.kind, "true" if verdict.accepted else "false")
            counts[found] = counts.get(found, 0) + 1
        self._metrics.policy_objects.clear()
        for (kind, accepted), count in counts.items():
            self._metrics.policy_objects.labels(kind, accepted).set(count)
        self._publish()
        if self.status is not None:
            self.status.composed(composed)

    def _file_yielded(self, conflict: str, version: str) -> None:
        if self._state is not None:
            self._state.rejected(
                f"the file where it conflicts with a ClusterMirrorPolicy: {conflict}",
                serving=version,
            )
