"""YAML from files people give us, loaded within bounds: the policy, `rewrite`'s manifests
and the kubelet's CredentialProviderConfig.

PyYAML's safe loader runs no code, but it bounds nothing either. 400 bytes
of aliases (``&a [x, x, ...]``, ``&b [*a, *a, ...]``, ...) decode to a value
of a billion elements that shares its parts; the first reader that walks
it, or quotes it in an error, does a billion steps. Nesting a few thousand
deep overflows the composer's recursion. Both are refused here, before
anything is built:

* the documents are built straight from libyaml's parser events, in one
  iterative pass (no composer, no recursion), with PyYAML's safe scalar
  rules (``yes`` is true, ``0x1F`` a number, ...) and merge keys;
* on the way each value's size is counted with every alias expanded, and
  its depth: the first value past :data:`MAX_VALUES` or :data:`MAX_DEPTH`
  is refused at its position. Tags other than the standard scalar ones
  (``!!set``, ``!!omap``, custom tags) are refused too.

It must also stay faster than libyaml's own composer and constructor, which
it replaces: a policy is reloaded beside admissions.

Every refusal is a :class:`YAMLError` naming the source, the line and column,
and the limit it passed; never a traceback.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml import events

__all__ = ["MAX_DEPTH", "MAX_VALUES", "YAMLError", "load_all"]

MAX_DEPTH = 64
"""Nested mappings and lists; a policy needs 4, a workload manifest about 12."""
MAX_VALUES = 200_000
"""Values in one document, counted with every alias expanded: a 10,000-rule policy holds
about 60,000."""
_INT_DIGITS_MAX = 4300  # CPython's int-from-text limit (sys.get_int_max_str_digits)


class YAMLError(ValueError):
    """Text that is not YAML we load; the message names the source, where, and why."""


_TAG = "tag:yaml.org,2002:"
_STR, _MAP, _SEQ, _MERGE = (f"{_TAG}{name}" for name in ("str", "map", "seq", "merge"))
_SCALAR_TAGS = frozenset(
    f"{_TAG}{name}" for name in ("str", "int", "float", "bool", "null", "timestamp", "binary")
)
_STARTS = (events.MappingStartEvent, events.SequenceStartEvent)
_ENDS = (events.MappingEndEvent, events.SequenceEndEvent)


class _Loader(yaml.CSafeLoader):
    """libyaml's parser and the safe loader's scalar rules; numbers too long to convert refused."""

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        digits = sum(c.isdigit() for c in node.value)
        if digits > _INT_DIGITS_MAX:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"a number of {digits:,} digits (at most {_INT_DIGITS_MAX:,})",
                node.start_mark,
            )
        return super().construct_yaml_int(node)


_Loader.add_constructor(f"{_TAG}int", _Loader.construct_yaml_int)


class _Refused(yaml.MarkedYAMLError):
    """A document past a bound, or a construct this loader does not take."""


def _refusal(problem: str, at: Any) -> _Refused:
    return _Refused(None, None, problem, at.start_mark)


class _Collection:
    """A mapping or list being built: what it holds so far, counted with aliases expanded."""

    __slots__ = ("anchor", "key", "merges", "size", "start", "value")

    def __init__(self, start: events.CollectionStartEvent) -> None:
        self.start, self.anchor, self.size = start, start.anchor, 1
        self.value: dict[Any, Any] | list[Any] = (
            {} if isinstance(start, events.MappingStartEvent) else []
        )
        self.key: Any = _NO_KEY
        self.merges: list[Any] = []

    def add(self, item: Any, event: events.NodeEvent, merge_key: bool) -> None:
        value = self.value
        if type(value) is list:
            value.append(item)
        elif self.key is _NO_KEY:
            try:
                hash(item)
            except TypeError:
                raise _refusal("a mapping key that is a list or mapping", event) from None
            self.key = _MERGING if merge_key else item
        elif self.key is _MERGING:
            self.merges.append((item, event))
            self.key = _NO_KEY
        else:
            value[self.key] = item
            self.key = _NO_KEY

    def finish(self) -> dict[Any, Any] | list[Any]:
        """The value; a mapping's ``<<`` merges fill in the keys it does not set itself."""
        value = self.value
        if not self.merges or type(value) is not dict:
            return value
        merged: dict[Any, Any] = {}
        for item, event in reversed(self.merges):
            sources = item if type(item) is list else [item]
            for source in reversed(sources):  # the first one listed wins, as in PyYAML
                if type(source) is not dict:
                    raise _refusal("a merge key (<<) takes a mapping or a list of mappings", event)
                merged.update(source)
        merged.update(value)
        value.clear()
        value.update(merged)
        return value


_NO_KEY, _MERGING = object(), object()  # a mapping's state: no key yet, a << key read


def _documents(data: bytes | str, source: str) -> list[Any]:
    """Build each document from libyaml's events, refusing what passes a bound on the way.

    One pass, no recursion: a value's size (with aliases expanded) is known
    when it ends, so an alias bomb is refused at the alias that passes
    :data:`MAX_VALUES`, before anything walks it.
    """
    loader = _Loader(data)
    try:
        documents: list[Any] = []
        stack: list[_Collection] = []
        anchors: dict[str, tuple[Any, int]] = {}  # complete anchored values and their sizes
        total = 0
        while True:
            event: Any = loader.get_event()
            kind = type(event)
            merge_key = False
            if kind is events.ScalarEvent:
                tag = event.tag
                if tag is None or tag == "!":
                    tag = loader.resolve(  # type: ignore[no-untyped-call]
                        yaml.ScalarNode, event.value, event.implicit
                    )
                if tag == _STR:
                    item = event.value
                elif tag == _MERGE:
                    item, merge_key = event.value, True
                elif tag in _SCALAR_TAGS:
                    item = loader.yaml_constructors[tag](
                        loader,
                        yaml.ScalarNode(
                            tag, event.value, event.start_mark, event.end_mark, event.style
                        ),
                    )
                else:
                    raise _refusal(f"the tag {_shown(tag)} is not supported", event)
                anchor, size = event.anchor, 1
            elif kind is events.AliasEvent:
                found = anchors.get(event.anchor or "")
                if found is None:
                    why = (
                        "refers to a value that contains it"
                        if any(c.anchor == event.anchor for c in stack)
                        else "names no anchor before it"
                    )
                    raise _refusal(f"alias *{_shown(event.anchor)} {why}", event)
                (item, size), anchor = found, None
            elif kind in _STARTS:
                if event.tag not in (None, "!", _MAP, _SEQ):
                    raise _refusal(f"the tag {_shown(event.tag)} is not supported", event)
                if len(stack) >= MAX_DEPTH:
                    raise _refusal(f"nested more than {MAX_DEPTH} deep", event)
                stack.append(_Collection(event))
                continue
            elif kind in _ENDS:
                done = stack.pop()
                item, anchor, size, event = done.finish(), done.anchor, done.size, done.start
            elif kind is events.DocumentEndEvent:
                anchors.clear()  # anchors belong to their document
                total = 0
                continue
            elif kind is events.StreamEndEvent:
                return documents
            else:
                continue
            if anchor is not None:
                anchors[anchor] = (item, size)
            if stack:
                parent = stack[-1]
                parent.add(item, event, merge_key)
                parent.size += size
                size = parent.size
            else:
                documents.append(item)
                total += size
                size = total
            if size > MAX_VALUES:
                raise _refusal(
                    f"holds more than {MAX_VALUES:,} values with its aliases expanded", event
                )
    finally:
        loader.dispose()


def _shown(anchor: str | None) -> str:
    """An anchor or tag for a message: they are short, but nothing says they must be."""
    text = (anchor or "").replace(_TAG, "!!", 1)
    return text if len(text) <= 64 else f"{text[:64]}… ({len(text):,} characters)"


def load_all(data: bytes | str, *, source: str) -> list[Any]:
    """The documents of ``data``; :class:`YAMLError` names ``source`` and the position."""
    try:
        return _documents(data, source)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark is not None else source
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        what = "" if isinstance(error, _Refused) else "not valid YAML: "
        raise YAMLError(f"{where}: {what}{problem}") from None
