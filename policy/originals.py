"""The original-images record: what mirrorgate rewrote, and what it cannot be made to say.

The annotation ``mirrorgate.io/original-images`` maps a container's key to
the image it had before mirrorgate rewrote it. At create time the value is
the client's to write, so nothing in it is believed as given:

* a value that is not one flat JSON object of strings, however deep, or that
  is longer than the API server lets all of a Pod's annotations be, is
  unreadable: treated as absent;
* an entry is kept only where the container's current image is what the
  policy makes of that original (the reinvocation case: mirrorgate's own
  earlier rewrite, fed back to it). An entry naming a fake original, or a
  container that does not exist, is dropped.

What is dropped is rebuilt from the images actually rewritten, and the
client is told. The record never decides a rewrite: it is written, never
read to skip one.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from typing import NamedTuple

from mirrorgate.policy.matching import Resolution
from mirrorgate.policy.plans import ORIGINAL_IMAGES_ANNOTATION
from mirrorgate.policy.quoting import quote
from mirrorgate.policy.sites import ImageSite

__all__ = ["RECORD_LENGTH_MAX", "Record", "existing_record"]

RECORD_LENGTH_MAX = 256 * 1024
"""Characters of the annotation that are read: the API server's limit on all of a Pod's
annotations together (apimachinery's TotalAnnotationSizeLimitB), so a longer value
cannot belong to a Pod that is admitted."""
_SHOWN_KEYS = 3
"""Dropped keys a warning names; it counts the rest."""

# A JSON string, unrolled so that the match is one linear pass.
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')


class Record(NamedTuple):
    """What planning starts from: the entries kept, and what the client is told."""

    kept: dict[str, str]
    rebuilt: bool
    """Something of the annotation was not kept: it must be written anew (or removed)."""
    warning: str | None


def _unreadable(why: str) -> str:
    return (
        f"annotation {ORIGINAL_IMAGES_ANNOTATION} {why}; treated as absent and rebuilt "
        "from the images rewritten now"
    )


def _decoded(raw: object) -> dict[str, str] | None:
    """The record as a flat object of strings; None when it is not one.

    The value is screened before it is decoded, in one pass and without
    recursion, so that lists or objects nested thousands deep are refused as
    what they are (not a record) instead of overflowing the decoder's
    recursion. A record holds one object and no list.
    """
    if not isinstance(raw, str):
        return None
    outside_strings = _JSON_STRING.sub("", raw)
    if "[" in outside_strings or outside_strings.count("{") > 1:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(value, dict) or not all(_encodable(v) for v in value.values()):
        return None
    if not all(_encodable(k) for k in value):
        return None
    return value


def _encodable(text: object) -> bool:
    """A string that can be written back: JSON's ``\\ud800`` decodes to a lone surrogate,
    which no UTF-8 encoder (and so no patch) accepts."""
    if not isinstance(text, str):
        return False
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def existing_record(
    annotations: Mapping[str, object],
    sites: Iterable[ImageSite],
    resolve: Callable[[str], Resolution],
) -> Record:
    """The entries of the Pod's record that are mirrorgate's own (see the module).

    ``sites`` are the images planned and ``resolve`` what the policy makes of
    an image: an entry is kept when its key is one of ``sites`` and the
    original resolves to a rewrite onto exactly that site's image (by its rule,
    or by a broader rule its chain falls through to). One
    resolution per kept candidate, so the cost is bounded by the Pod's
    containers, not by the record's size.
    """
    raw = annotations.get(ORIGINAL_IMAGES_ANNOTATION)
    if raw is None:
        return Record({}, False, None)
    if isinstance(raw, str) and len(raw) > RECORD_LENGTH_MAX:
        return Record(
            {},
            True,
            _unreadable(
                f"is {len(raw):,} characters, longer than the API "
                f"server allows all of a Pod's annotations ({RECORD_LENGTH_MAX:,})"
            ),
        )
    record = _decoded(raw)
    if record is None:
        return Record({}, True, _unreadable("is not a JSON object of strings"))
    images = {site.key: site.image for site in sites}
    kept: dict[str, str] = {}
    for key, original in record.items():
        current = images.get(key)
        # Under onNotGranted: next, the image may be on any mirror of the chain.
        if current is not None and current in resolve(original).new_images():
            kept[key] = original
    if len(kept) == len(record):
        return Record(kept, False, None)
    dropped = [key for key in record if key not in kept]
    shown = ", ".join(quote(key, limit=80) for key in dropped[:_SHOWN_KEYS])
    more = f" and {len(dropped) - _SHOWN_KEYS:,} more" if len(dropped) > _SHOWN_KEYS else ""
    return Record(
        kept,
        True,
        f"annotation {ORIGINAL_IMAGES_ANNOTATION}: the entries for {shown}{more} are not "
        "the originals of those containers' images on their mirror; dropped, and the "
        "record rebuilt from the images rewritten now",
    )
