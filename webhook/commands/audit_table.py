"""The audit report as a table for a terminal."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator, Sequence

from mirrorgate.webhook.commands.audit_report import OUTCOMES, UNMIRRORED, NamespaceReport, Report

__all__ = ["render_table", "thousands"]

COUNT_WIDTH, OUTCOME_WIDTH = 7, 11
# Continuation lines (the new image, the reason) start under the IMAGE column.
DETAIL_INDENT = " " * (2 + COUNT_WIDTH + 2 + OUTCOME_WIDTH + 2)


def thousands(value: int) -> str:
    """``12,345``: counts are read at a glance."""
    return f"{value:,}"


def _plural(count: int, word: str) -> str:
    return f"{thousands(count)} {word}{'' if count == 1 else 's'}"


def render_table(report: Report) -> str:
    """Fits 80 columns except for long image names, which are never cut."""
    spaces = report.ordered()
    lines = [
        f"mirrorgate audit: {_plural(len(spaces), 'namespace')}, "
        f"{_plural(sum(ns.pods for ns in spaces), 'pod')}",
        f"policy: {report.policy_path}",
    ]
    for ns in spaces:
        lines.append("")
        lines.extend(_namespace_lines(ns))
    lines.append("")
    lines.extend(_summary_lines(report, spaces))
    return "\n".join(lines) + "\n"


def _namespace_lines(ns: NamespaceReport) -> Iterator[str]:
    head = f"NAMESPACE {ns.name}  mode: {ns.mode}  pods: {thousands(ns.pods)}"
    if ns.skipped_pods:
        head += f" ({thousands(ns.skipped_pods)} skipped)"
    if ns.excluded:
        yield head + "  excluded by the policy"
        return
    yield head
    if not ns.images:
        yield "  (no images to examine)"
        return
    yield f"  {'PODS':>{COUNT_WIDTH}}  {'STATUS':<{OUTCOME_WIDTH}}  IMAGE"
    for image, tally in ns.rows():
        verdict = tally.verdict
        pods = thousands(tally.pods)
        yield f"  {pods:>{COUNT_WIDTH}}  {verdict.outcome:<{OUTCOME_WIDTH}}  {image}"
        if verdict.new_image is not None:
            yield f"{DETAIL_INDENT}→ {verdict.new_image}"
            if verdict.credential is not None:
                # With several credentials on one mirror host, which one a
                # rewritten image gets is part of the answer.
                yield f"{DETAIL_INDENT}  with credential {verdict.credential}"
        for note in (
            verdict.reason,
            None if verdict.health is None else f"health: {verdict.health}",
        ):
            if note is None:
                continue
            # Notes wrap at 80 columns; image names never do (they are copied).
            for line in textwrap.wrap(
                f"({note})",
                width=80 - len(DETAIL_INDENT),
                break_long_words=False,
                break_on_hyphens=False,
            ):
                yield DETAIL_INDENT + line


def _summary_lines(report: Report, spaces: Sequence[NamespaceReport]) -> Iterator[str]:
    containers, images = report.totals()
    yield f"SUMMARY  {'':<{OUTCOME_WIDTH}}  {'CONTAINERS':>10}  {'IMAGES':>8}"
    for outcome in OUTCOMES:
        yield (
            f"  {outcome:<{OUTCOME_WIDTH + 7}}  {thousands(containers[outcome]):>10}  "
            f"{thousands(images[outcome]):>8}"
        )
    excluded = [ns for ns in spaces if ns.excluded]
    skipped = sum(ns.skipped_pods for ns in spaces)
    yield (
        f"  skipped pods: {thousands(skipped)}   excluded namespaces: {thousands(len(excluded))} "
        f"({_plural(sum(ns.pods for ns in excluded), 'pod')})"
    )
    unmirrored = sum(containers[o] for o in UNMIRRORED)
    yield (
        f"  unmirrored: {_plural(unmirrored, 'container')} (rewrite, not-granted, "
        "unmatched, invalid)"
    )
    if report.fail_on is not None:
        verdict = "FAILED" if report.failed else "passed"
        yield f"--fail-on {report.fail_on}: {verdict}"
