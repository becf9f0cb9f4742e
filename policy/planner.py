"""Rewrite planning: a Pod and its namespace in, a plan out.

The plan says which image of which container changes, which pull secrets to
attach, the new value of the original-images annotation, and the warnings to
show. It touches nothing: turning it into a JSON Patch, or deciding that
audit mode only reports it, is the caller's job.

Planning is idempotent by contract: the plan for a Pod that already carries
a plan's changes is empty. Admission reinvocation and Pod updates feed our own
output back to us, and an image under a mirror prefix is therefore final.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping
from typing import NamedTuple

from mirrorgate.policy import failover
from mirrorgate.policy.decision import (
    MIRROR_POD_ANNOTATION,
    SKIP_LABEL,
    ImageOutcome,
    decide_image,
    exempt_pod,
)
from mirrorgate.policy.health import HEALTHY, Health
from mirrorgate.policy.matching import Resolution
from mirrorgate.policy.model import Policy
from mirrorgate.policy.originals import Record, existing_record
from mirrorgate.policy.plans import (
    ORIGINAL_IMAGES_ANNOTATION,
    PULL_SECRET_PREFIX,
    ImageRewrite,
    RewritePlan,
    UnmirroredReason,
    audit_mode_line,
    credential_warning,
    pull_secret_name,
)
from mirrorgate.policy.quoting import quote
from mirrorgate.policy.sites import (
    CONTAINER_FIELDS,
    NEVER,
    SITE_FIELDS,
    ContainerField,
    ImageSite,
    SiteField,
    as_mapping,
    container_lists,
    find_image_sites,
    image_volumes,
    spec_sites,
)

__all__ = [
    "CONTAINER_FIELDS",
    "MIRROR_POD_ANNOTATION",
    "ORIGINAL_IMAGES_ANNOTATION",
    "PULL_SECRET_PREFIX",
    "SITE_FIELDS",
    "SKIP_LABEL",
    "ContainerField",
    "ImageRewrite",
    "ImageSite",
    "RewritePlan",
    "ShapeKey",
    "SiteField",
    "audit_mode_line",
    "find_image_sites",
    "plan",
    "pull_secret_name",
    "shape_key",
]


def _existing_pull_secrets(spec: Mapping[str, object]) -> set[str] | None:
    secrets = spec.get("imagePullSecrets")
    if secrets is None:
        return set()
    if not isinstance(secrets, list):
        return None
    # Only string names can be ours; anything else (even an object nested a
    # thousand deep) is left for the API server's validation to refuse.
    return {
        name
        for s in secrets
        if type(s) is dict or isinstance(s, Mapping)
        if isinstance(name := s.get("name"), str)
    }


def _refusal(credential: str, *, attached: set[str], can_add_pull_secrets: bool) -> str | None:
    """Why a granted credential's images must stay as written in this operation, or None."""
    secret = pull_secret_name(credential)
    if secret not in attached and not can_add_pull_secrets:
        return f"the Pod's imagePullSecrets cannot gain {secret!r} in this operation"
    return None


class ShapeKey(NamedTuple):
    """What a CREATE plan reads of a Pod, its namespace and the health (:func:`shape_key`)."""

    namespace: str
    health: Health | None
    skip: str | None
    static: bool
    originals: str | None
    pull_secrets: tuple[str | None, ...] | None
    has_annotations: bool
    containers: tuple[tuple[str, str], ...] | None
    init_containers: tuple[tuple[str, str], ...] | None
    ephemeral_containers: tuple[tuple[str, str], ...] | None
    image_volumes: tuple[tuple[int, str, str], ...]
    """Each image volume's index among the volumes (its patch's pointer), name and reference."""
    pull_never: tuple[tuple[int, int], ...] = ()
    """Where the pull policy is ``Never``: (list, index), the lists numbered in
    :data:`SITE_FIELDS` order (volumes by their index among the volumes)."""


def shape_key(pod: Mapping[str, object], namespace: str, health: Health) -> ShapeKey | None:
    """Everything a CREATE plan (and its patch) depends on, as a hashable key; None for
    unusual Pods.

    The replicas of a workload differ in name and uid but not in this, so a
    caller may keep one plan per key. The key has one position per input, and
    each container list is a tuple of ``(name, image)`` pairs of its own, so
    two Pods share a key only when they are equal in everything the plan and
    its patch read: no name or image can shift into another field's place.
    Anything not plain JSON of the expected shape returns None (plan it in full).
    """
    metadata = pod.get("metadata")
    spec = pod.get("spec")
    if type(metadata) is not dict or type(spec) is not dict:
        return None
    labels, annotations = metadata.get("labels"), metadata.get("annotations")
    if labels is None:
        labels = {}
    has_annotations = annotations is not None
    if annotations is None:
        annotations = {}
    if type(labels) is not dict or type(annotations) is not dict:
        return None
    secrets = spec.get("imagePullSecrets")
    if secrets is not None:
        if type(secrets) is not list or any(type(s) is not dict for s in secrets):
            return None
        secrets = tuple(s.get("name") for s in secrets)
    skip, originals = labels.get(SKIP_LABEL), annotations.get(ORIGINAL_IMAGES_ANNOTATION)
    # Only plain strings go into the key: anything else may not even be hashable.
    if not all(v is None or type(v) is str for v in (skip, originals, *(secrets or ()))):
        return None
    lists: list[tuple[tuple[str, str], ...] | None] = []
    never: list[tuple[int, int]] = []
    for number, (_, containers) in enumerate(container_lists(spec)):
        if containers is None:
            lists.append(None)
            continue
        if type(containers) is not list:
            return None
        pairs: list[tuple[str, str]] = []
        for index, container in enumerate(containers):
            if type(container) is not dict:
                return None
            name, image = container.get("name"), container.get("image")
            if type(name) is not str or not name or type(image) is not str:
                return None
            pairs.append((name, image))
            if container.get("imagePullPolicy") == NEVER:
                never.append((number, index))
        lists.append(tuple(pairs))
    volumes = spec.get("volumes")
    if volumes is not None and type(volumes) is not list:
        return None
    triples: list[tuple[int, str, str]] = []
    for index, volume in image_volumes(spec):
        assert type(volume) is dict
        name, source = volume.get("name"), volume["image"]
        reference = source.get("reference") if type(source) is dict else None
        if type(name) is not str or not name or type(reference) is not str:
            return None
        triples.append((index, name, reference))
        if type(source) is dict and source.get("pullPolicy") == NEVER:
            never.append((len(CONTAINER_FIELDS), index))
    # The health is the probes' last conclusion, one value until they change it.
    return ShapeKey(
        namespace,
        health if health or not health.probed else None,
        skip,
        MIRROR_POD_ANNOTATION in annotations,
        originals,
        secrets,
        has_annotations,
        lists[0],
        lists[1],
        lists[2],
        tuple(triples),
        tuple(never),
    )


def plan(
    pod: Mapping[str, object],
    *,
    namespace: str,
    mirror_policy: Policy,
    fields: Collection[SiteField] = SITE_FIELDS,
    previous: Mapping[str, str] | None = None,
    can_add_pull_secrets: bool = True,
    can_annotate: bool = True,
    health: Health = HEALTHY,
    resolve: Callable[[str], Resolution] | None = None,
    namespace_labels: Mapping[str, str] | None = None,
) -> RewritePlan:
    """Plan the rewrites for ``pod`` in ``namespace``: a pure function of its arguments.

    ``fields`` limits the sites considered (containers, init and ephemeral
    containers, image volumes). ``previous`` is an UPDATE's ``oldObject``
    images by site key: a site whose image is what it was is left alone,
    whatever it is, so that an update that changes no image changes nothing
    (and restarts no container). ``can_add_pull_secrets`` and
    ``can_annotate`` are false where the API server ignores changes to
    ``imagePullSecrets`` and to metadata (then ``original_images`` stays
    None); an image whose credential's pull secret the Pod lacks and cannot
    gain is left as written and listed in :attr:`RewritePlan.unattachable`,
    for the caller to refuse or allow. ``health`` holds the mirrors that
    are down and the credentials that cannot log in: images under their rules
    stay as written with a warning naming the mirror (``onMirrorDown:
    fallback``) or are rewritten anyway (``keep``). A pull secret that could
    not be made is the caller's to apply afterwards (:meth:`RewritePlan.without`).
    A credential of ``delivery: kubelet`` has no pull secret: its images are
    rewritten and recorded like any other, and the plan asks for no Secret.

    ``resolve`` answers :meth:`Policy.resolve` for ``mirror_policy``; a caller
    that keeps resolutions passes its own (the webhook's admission cache).
    ``namespace_labels`` are the namespace's labels, for grants by
    ``namespaceSelector`` (None: not known; only names grant).
    """
    metadata = as_mapping(pod.get("metadata"))
    annotations = as_mapping(metadata.get("annotations"))
    spec = as_mapping(pod.get("spec"))
    exemption = exempt_pod(
        namespace=namespace,
        labels=as_mapping(metadata.get("labels")),
        annotations=annotations,
        mirror_policy=mirror_policy,
    )
    sites, warnings = spec_sites(spec, fields)
    if exemption is not None:
        return RewritePlan(
            skipped=exemption.reason,
            outcomes=dict.fromkeys((s.key for s in sites), exemption.outcome),
        )
    resolve = resolve or mirror_policy.resolve
    # The record never decides a rewrite; only what is mirrorgate's own is kept. It is
    # the whole Pod's: judged against every container list, and not at all where the
    # metadata cannot change (an ephemeral-container update).
    record = Record({}, False, None)
    if can_annotate:
        whole = sites if fields is SITE_FIELDS else spec_sites(spec)[0]
        record = existing_record(annotations, _as_before(whole, previous), resolve)
    originals, rebuilt, record_warning = record
    if record_warning is not None:
        warnings.append(record_warning)
    attached = _existing_pull_secrets(spec)
    if attached is None:
        warnings.append("spec.imagePullSecrets is not a list; pull secrets cannot be attached")
        attached, can_add_pull_secrets = set(), False

    rewrites: list[ImageRewrite] = []
    outcomes: dict[str, ImageOutcome] = {}
    refusals: dict[str, str | None] = {}
    needed: set[str] = set()
    credential_sites: list[tuple[ImageSite, str]] = []
    new_originals: dict[str, str] = {}
    fallbacks = 0
    unattachable: list[tuple[ImageSite, str]] = []
    unmirrored: dict[str, UnmirroredReason] = {}
    denials: list[str] = []
    for site in sites:
        key = site.key
        if previous is not None and previous.get(key) == site.image:
            continue
        decision = decide_image(
            resolve(site.image),
            namespace=namespace,
            mirror_policy=mirror_policy,
            labels=namespace_labels,
            pull_never=site.pull_never,
        )
        outcomes[key] = decision.outcome
        if decision.warning is not None:
            warnings.append(f"{site.shown}: {decision.warning}")
        rule = decision.resolution.rule
        if decision.outcome == "not-granted":
            unmirrored[key] = "credential-ambiguous" if decision.ambiguous else "not-granted"
            if decision.denial is not None:
                denials.append(f"{site.shown}: image {quote(site.image)}: {decision.denial}")
        elif decision.outcome == "pull-policy-never":
            unmirrored[key] = "pull-policy-never"
        elif decision.outcome == "invalid" and decision.resolution.reference is not None:
            unmirrored[key] = "invalid"  # a valid reference, under a rule it cannot follow
        if (
            decision.outcome not in ("rewrite", "already-mirrored")
            or rule is None
            or decision.warning is not None
        ):
            continue
        new_image = decision.resolution.new_image
        credential = decision.credential
        choice = None
        if decision.outcome == "rewrite":
            choice = failover.choose_mirror(
                decision.resolution,
                health=health,
                mirror_policy=mirror_policy,
                namespace=namespace,
                labels=namespace_labels,
            )
            # decide_image said ``rewrite``: some mirror of the rule is granted.
            assert choice is not None
            rule, new_image, credential = choice.rule, choice.new_image, choice.credential
        grant = mirror_policy.grants.get(credential) if credential is not None else None
        if grant is not None and not grant.pull_secret:
            # delivery: kubelet: the node's plugin fetches the login for each pull, so
            # there is no Secret to make or attach, and nothing an operation cannot add.
            credential = None
        if credential is not None:
            # Decided once per credential: a Pod's images mostly share one.
            if credential not in refusals:
                refusals[credential] = _refusal(
                    credential, attached=attached, can_add_pull_secrets=can_add_pull_secrets
                )
            reason = refusals[credential]
            if reason is not None:
                outcomes[key] = "credential-unavailable"
                unattachable.append((site, pull_secret_name(credential)))
                if decision.outcome == "rewrite":
                    unmirrored[key] = "credential-unavailable"
                warnings.append(
                    credential_warning(
                        site, reason, mirrored=decision.outcome == "already-mirrored"
                    )
                )
                continue
        status = health.well
        if choice is not None:
            note = failover.health_warning(site.image, choice)
            if note is not None:
                warnings.append(f"{site.shown}: {note}")
            if choice.problem is not None and rule.on_mirror_down == "fallback":
                outcomes[key] = unmirrored[key] = "mirror-unhealthy"
                fallbacks += 1
                continue
            status = choice.problem or status
        if credential is not None:
            needed.add(credential)
            credential_sites.append((site, credential))
        if decision.outcome == "already-mirrored":
            continue
        assert new_image is not None
        rewrites.append(ImageRewrite(site, new_image, rule.label, status, str(rule.mirror)))
        if can_annotate and originals.get(key) != site.image:
            # The original of what is there now: a later webhook's or an
            # update's new image replaces whatever the record said before.
            new_originals[key] = site.image

    credentials = tuple(sorted(needed))
    return RewritePlan(
        rewrites=tuple(rewrites),
        pull_secrets=tuple(
            pull_secret_name(c) for c in credentials if pull_secret_name(c) not in attached
        ),
        credentials=credentials,
        original_images={**originals, **new_originals} if new_originals or rebuilt else None,
        warnings=tuple(warnings),
        outcomes=outcomes,
        fallbacks=fallbacks,
        credential_sites=tuple(credential_sites),
        recorded=frozenset(new_originals),
        unmirrored=unmirrored,
        unattachable=tuple(unattachable),
        rebuilt=rebuilt,
        denials=tuple(denials),
    )


def _as_before(sites: list[ImageSite], previous: Mapping[str, str] | None) -> list[ImageSite]:
    """``sites`` with an UPDATE's changed images as they were: the record is judged against
    what it recorded, so that an entry an update makes stale is replaced, not called fake."""
    if not previous:
        return sites
    return [
        dataclasses.replace(s, image=previous[s.key])
        if s.key in previous and previous[s.key] != s.image
        else s
        for s in sites
    ]
