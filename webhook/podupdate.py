"""What an UPDATE of a Pod brings to planning: its old images, and the skip label it had."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mirrorgate import policy
from mirrorgate.webhook import review

__all__ = ["as_it_was_labelled", "previous_images"]


def previous_images(
    request: review.AdmissionRequest, fields: Sequence[policy.SiteField]
) -> dict[str, str]:
    """An UPDATE's old images by site key: what planning leaves alone where unchanged."""
    old = request.get("oldObject")
    if type(old) is not dict:
        return {}
    return {site.key: site.image for site in policy.find_image_sites(old, fields=fields)[0]}


def as_it_was_labelled(obj: dict[str, Any], old: object) -> dict[str, Any]:
    """``obj`` with the skip label the Pod had before this update, not the one it adds.

    A Pod enforced at creation stays enforced: a tenant who adds
    mirrorgate.io/skip=true in the update that changes an image would otherwise
    switch rewriting off for it. (A Pod created with the label is never sent
    to mirrorgate at all: the webhooks' objectSelector.)
    """
    metadata, old_metadata = obj.get("metadata"), old.get("metadata") if type(old) is dict else None
    labels = metadata.get("labels") if type(metadata) is dict else None
    if type(labels) is not dict or labels.get(policy.SKIP_LABEL) != "true":
        return obj
    old_labels = old_metadata.get("labels") if type(old_metadata) is dict else None
    if type(old_labels) is dict and old_labels.get(policy.SKIP_LABEL) == "true":
        return obj
    assert type(metadata) is dict
    kept = {k: v for k, v in labels.items() if k != policy.SKIP_LABEL}
    return {**obj, "metadata": {**metadata, "labels": kept}}
