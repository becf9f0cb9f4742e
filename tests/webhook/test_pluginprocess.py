"""One plugin run: the tail of standard error is whole lines (a plugin here is a shell script)."""

from __future__ import annotations

import pytest

from mirrorgate.webhook.credentials import pluginprocess


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        # 64 lines of 101 bytes: the 1 KiB tail starts with the last 14 bytes of one: dropped.
        pytest.param(
            "for i in $(seq 1000 1063); do printf 'line %s %s\\n' $i $(printf '%090d' 0) >&2; done",
            [f"line {i} {'0' * 90}" for i in range(1054, 1064)],
            id="lines",
        ),
        pytest.param("printf '%05000d' 0 >&2", [], id="one-line-without-end"),
        pytest.param("echo short >&2", ["short"], id="not-cut"),
    ],
)
def test_the_tail_of_stderr_is_whole_lines(script: str, expected: list[str]) -> None:
    finished = pluginprocess.run(
        ["/bin/sh", "-c", script],
        {"PATH": "/usr/bin:/bin"},
        b"",
        timeout=10.0,
        stdout_limit=1024,
        stderr_limit=1024,
    )
    assert (finished.failure, finished.returncode) == (None, 0)
    assert finished.stderr.decode().splitlines() == expected
