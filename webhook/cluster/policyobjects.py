"""The policy in force in a cluster: the ClusterMirrorPolicy and MirrorPolicy objects, composed.

Two informers keep every object of the two kinds in memory, and the Namespace cache
gives the labels that grant by ``namespaceSelector``. After any change of either, or of
the policy file, one background loop composes them anew (:func:`policy.compose`, the code
``policy check`` and the policy webhook run) and publishes the result in one reference
swap. Admission reads memory only: it never waits for a composition, it serves the last
one whole.

The policy file (``serve --policy``, the ConfigMap policy: deprecated, served beside the
objects for one minor version) is one more cluster object, :data:`FILE_KEY`, judged as
the newest: where it conflicts with a ClusterMirrorPolicy (the same source, credential,
``health`` or ``onCredentialError``), the file yields, whole. So the output of ``policy
migrate``, applied while the file is still served, takes over every rule at once (no
gap), and removing the ConfigMap afterwards changes nothing. A file that yields is
logged and reported as a Warning Event on the ConfigMap.

Until both informers have listed once, /readyz says so: a replica serving the file alone
would apply no team's rules.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

from mirrorgate import policy
from mirrorgate.webhook import policyfile
from mirrorgate.webhook.background import Loop
from mirrorgate.webhook.cluster import kube
from mirrorgate.webhook.cluster.informer import Informer
from mirrorgate.webhook.logs import logger
from mirrorgate.webhook.policyfile import boundedyaml

__all__ = [
    "FILE_KEY",
    "PATHS",
    "RESOURCES",
    "Composed",
    "PolicyObjects",
    "compose_stored",
    "file_objects",
    "key_of",
    "objects_path",
    "read_objects",
]

RESOURCES: dict[str, str] = {
    policy.CLUSTER_KIND: "clustermirrorpolicies",
    policy.NAMESPACED_KIND: "mirrorpolicies",
}
"""Each kind's resource name."""


def objects_path(kind: str, namespace: str | None = None) -> str:
    """Where the objects of ``kind`` are listed: cluster-wide, or a namespace's."""
    where = f"namespaces/{quote(namespace)}/" if namespace is not None else ""
    return f"/apis/{policy.API_VERSION}/{where}{RESOURCES[kind]}"


PATHS = tuple((kind, objects_path(kind)) for kind in RESOURCES)
"""Each kind and where it is listed and watched (cluster-wide)."""
FILE_KEY = policy.ObjectKey(policy.CLUSTER_KIND, "(the policy file)")
"""The policy file as a cluster object: not a valid object name, so no stored
ClusterMirrorPolicy can take it."""

Labels = Callable[[], Mapping[str, Mapping[str, str]]]
"""Every namespace's labels, as mirrorgate's Namespace cache holds them."""


@dataclasses.dataclass(frozen=True, eq=False)
class Composed:
    """One composition: what admission serves, the verdict on each stored object (the leader
    writes them as status) and the stored objects they were made from."""

    loaded: policyfile.LoadedPolicy
    verdicts: Mapping[policy.ObjectKey, policy.Verdict]
    stored: Mapping[policy.ObjectKey, dict[str, Any]]
    objects: tuple[policy.PolicyObject, ...] = ()
    """The stored objects read (the policy file not among them)."""
    file: tuple[policy.PolicyObject, ...] = ()
    """The policy file's, as it joined the composition."""


def file_objects(loaded: policyfile.LoadedPolicy) -> list[policy.PolicyObject]:
    """The policy file as cluster objects (its documents were read and judged once already):
    a policy document is one, :data:`FILE_KEY`; a file of objects is those objects."""
    documents = [d for d in boundedyaml.load_all(loaded.data, source=loaded.path) if d is not None]
    if any(policy.is_policy_object(d) for d in documents):
        return [
            policy.parse_object(d, namespace=policy.DEFAULT_OBJECT_NAMESPACE) for d in documents
        ]
    spec = documents[0] if documents and isinstance(documents[0], Mapping) else {}
    return [policy.PolicyObject(key=FILE_KEY, spec=spec, named=False)]


def read_objects(
    stored: Mapping[policy.ObjectKey, dict[str, Any]] | Any,
) -> tuple[list[policy.PolicyObject], dict[policy.ObjectKey, policy.Verdict]]:
    """The stored documents as objects, and the verdict on those whose envelope is unreadable
    (such an object is in force nowhere; the schema keeps most of them out)."""
    objects: list[policy.PolicyObject] = []
    refused: dict[policy.ObjectKey, policy.Verdict] = {}
    for key, document in stored.items():
        try:
            objects.append(policy.parse_object(document))
        except policy.PolicyError as error:
            generation = (document.get("metadata") or {}).get("generation", 0)
            message = "\n".join(str(e) for e in error.errors)
            refused[key] = policy.Verdict(
                False, "Invalid", message, generation if type(generation) is int else 0
            )
    return objects, refused


def key_of(obj: dict[str, Any]) -> policy.ObjectKey:
    """Which stored object ``obj`` is (its kind as the informer it came from lists it)."""
    metadata = obj.get("metadata") or {}
    namespace = metadata.get("namespace")
    kind = policy.CLUSTER_KIND if namespace is None else policy.NAMESPACED_KIND
    return policy.ObjectKey(kind, str(metadata.get("name", "")), namespace)


def compose_stored(
    stored: Mapping[policy.ObjectKey, dict[str, Any]],
    labels: Mapping[str, Mapping[str, str]],
    *,
    file: policyfile.LoadedPolicy | None = None,
    previous: Composed | None = None,
) -> Composed:
    """The composition of the ``stored`` objects (by :func:`key_of`) with the policy file,
    as the server serves it; ``labels`` are the namespaces' (a namespace missing: not
    known, only names grant there). The server composes with what its informers hold;
    ``mirrorgate audit`` with what it listed once."""
    objects, refused = read_objects(stored)
    judged, last, own = list(objects), None, []
    if file is not None:
        own = [o for o in file_objects(file) if o.key not in stored]
        judged.extend(own)
        last = FILE_KEY if own and own[0].key == FILE_KEY else None
    # What did not change stays the same object, and with it admission's plans for it.
    before = previous.loaded.composition if previous is not None else None
    composition = policy.compose(judged, labels, last=last, previous=before)
    verdicts = {**composition.verdicts, **refused}
    loaded = policyfile.LoadedPolicy(
        policy=composition.cluster,
        version=_version(file, stored, labels),
        path=file.path if file else "cluster objects",
        data=file.data if file else b"",
        composition=composition,
    )
    return Composed(loaded, verdicts, stored, tuple(objects), tuple(own))


def _version(
    file: policyfile.LoadedPolicy | None,
    stored: Mapping[policy.ObjectKey, dict[str, Any]],
    labels: Mapping[str, Mapping[str, str]],
) -> str:
    """What /readyz and mirrorgate_policy_info show: everything a composition is made of,
    hashed. The file's bytes, each object's uid and generation (a status write changes
    neither) and the labels of the namespaces that hold a MirrorPolicy (the only ones a
    composition reads): the same version is the same composition. With no object stored
    it is the file's own version, as without a cluster."""
    if not stored:
        return file.version if file is not None else "none"
    digest = hashlib.sha256(file.version.encode() if file else b"-")
    for key in sorted(stored, key=str):
        metadata = stored[key].get("metadata") or {}
        digest.update(f"\0{key}\0{metadata.get('uid')}\0{metadata.get('generation')}".encode())
    for namespace in sorted({key.namespace for key in stored if key.namespace is not None}):
        digest.update(f"\0{namespace}\0{sorted((labels.get(namespace) or {}).items())}".encode())
    return digest.hexdigest()[:12]


class PolicyObjects(Loop):
    """The informers of the two kinds and the loop that composes them with the file."""

    SETTLE = 0.05
    """Seconds a composition waits for more news after the first (a burst of events, as
    ``kubectl apply -f`` of a folder makes, costs one composition, not one per object)."""

    def __init__(
        self,
        client: kube.Kube,
        *,
        file: policyfile.LoadedPolicy | None,
        labels: Labels,
        publish: Callable[[Composed], None],
        file_yielded: Callable[[str, str], None] = lambda conflict, version: None,
    ) -> None:
        super().__init__("policy-objects", stop_timeout=5.0)
        self._file, self._labels, self._publish = file, labels, publish
        self._file_yields = file_yielded
        """Told (the conflict, the version served) when the file starts to yield."""
        self.informers = [
            Informer(client, path, name=kind, on_change=self._changed, missing_ok=True)
            for kind, path in PATHS
        ]
        self._generations: dict[policy.ObjectKey, object] = {}
        self.composed: Composed | None = None
        self._file_yielded: str | None = None

    @property
    def file(self) -> policyfile.LoadedPolicy | None:
        """The policy file's policy it composes with (None: no file)."""
        return self._file

    def problem(self) -> str | None:
        for informer in self.informers:
            if (found := informer.problem()) is not None:
                return found
        return None if self.composed is not None else "policy objects: not composed yet"

    def _changed(self, kind: str, obj: dict[str, Any]) -> None:
        """An informer's callback: compose again unless only the status changed (the
        leader's own write, which the generation does not count)."""
        key = key_of(obj)
        generation = (obj.get("metadata") or {}).get("generation")
        if kind == "DELETED":
            self._generations.pop(key, None)
        elif kind == "MODIFIED" and self._generations.get(key) == generation:
            return
        else:
            self._generations[key] = generation
        self.trigger()

    def stored(self, key: policy.ObjectKey) -> dict[str, Any] | None:
        """The object as its informer holds it now."""
        informer = self.informers[0 if key.namespace is None else 1]
        return informer.items.get((key.namespace or "", key.name))

    def file_changed(self, loaded: policyfile.LoadedPolicy, refused: str | None) -> None:
        """PolicyFile's subscriber: the file in force changed (or a reload was refused)."""
        if loaded is not self._file:
            self._file = loaded
            self.trigger()

    def namespaces_changed(self) -> None:
        self.trigger()

    def compose(self) -> Composed:
        """One composition of what the informers hold now with the file."""
        stored: dict[policy.ObjectKey, dict[str, Any]] = {}
        for informer in self.informers:
            for obj in list(informer.items.values()):
                stored[key_of(obj)] = obj
        return compose_stored(stored, self._labels(), file=self._file, previous=self.composed)

    def context(
        self, namespace: str | None
    ) -> tuple[tuple[policy.PolicyObject, ...], Mapping[str, Mapping[str, str]]]:
        """What a new object is judged beside at apply time: the objects stored now (as the
        informers hold them, not as last composed: a ClusterMirrorPolicy applied a moment
        before a MirrorPolicy that uses it counts), those that can bear on it only: the
        cluster's, and for a MirrorPolicy (``namespace`` given) its namespace's, the policy
        file (whose credentials and fixed rules bind it as in the composition) and the
        namespace's labels. A ClusterMirrorPolicy is judged without the file: the file
        yields to it."""
        cluster, namespaced = self.informers
        stored = {key_of(o): o for o in list(cluster.items.values())}
        if namespace is None:
            return tuple(read_objects(stored)[0]), {}
        stored |= {
            key_of(o): o for (where, _), o in list(namespaced.items.items()) if where == namespace
        }
        composed = self.composed
        own = (
            []
            if composed is None
            else [o for o in composed.file if composed.verdicts[o.key].accepted]
        )
        found = self._labels().get(namespace)
        labels = {namespace: found} if found is not None else {}
        return (*read_objects(stored)[0], *own), labels

    def _report_file(self, composed: Composed) -> None:
        verdict = composed.verdicts.get(FILE_KEY)
        yielded = None if verdict is None or verdict.accepted else verdict.message
        if yielded and yielded != self._file_yielded:
            logger.warning(
                "the policy file yields to the ClusterMirrorPolicies it conflicts with; "
                "remove the ConfigMap once they hold all of its rules",
                extra={"fields": {"file": composed.loaded.path, "conflict": yielded}},
            )
            self._file_yields(yielded, composed.loaded.version)
        self._file_yielded = yielded

    def _run(self) -> None:
        while not self.stopping:
            # Until the first composition, look often: an empty list calls no callback.
            self.sleep(3600.0 if self.composed is not None else self.SETTLE)
            if self.stopping:
                return
            if any(not i.synced.is_set() for i in self.informers):
                continue
            self.pause(self.SETTLE)
            self.take_trigger()
            try:
                composed = self.compose()
            except Exception:
                logger.exception("policy composition failed; the last one stays in force")
                continue
            if self.composed is not None and composed.loaded.version == (
                self.composed.loaded.version
            ):
                continue  # nothing it is made of changed (a namespace's unrelated label)
            self.composed = composed
            self._report_file(composed)
            self._publish(composed)

    def start(self) -> None:
        super().start()
        for informer in self.informers:
            informer.start()

    def stop(self) -> None:
        for informer in self.informers:
            informer.stop()
        super().stop()
