"""Policy files that would cost too much to read are refused in one clear line (issue 19, defect 3).

Every command reads the policy through one loader (`webhook.policyfile` on
`webhook.policyfile.boundedyaml`): `policy check`, `explain`, `rewrite` and `serve`'s
reloads, which run off the event loop.
"""

from __future__ import annotations

import asyncio
import io
import threading
from pathlib import Path

import pytest

from mirrorgate.webhook import cli, policyfile
from mirrorgate.webhook.edge.filewatch import FileWatcher
from mirrorgate.webhook.policyfile import boundedyaml
from tests.webhook import policies


def alias_bomb(levels: int, *, under: str) -> str:
    """``levels`` anchors, each a list of nine aliases of the one before: 9**levels values.

    ``under`` is where the last one is used: ``mode`` or ``source``.
    """
    lines = ["x0: &x0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"x{i}: &x{i} [{', '.join([f'*x{i - 1}'] * 9)}]" for i in range(1, levels)]
    use = f"*x{levels - 1}"
    if under == "mode":
        lines.append(f"mode: {use}")
    else:
        lines += ["mirrors:", f"  - source: {use}", "    mirror: m.example/a"]
    return "\n".join(lines) + "\n"


def nested(depth: int) -> str:
    return "mode: " + "[" * depth + "]" * depth + "\n"


def check(path: Path) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(["policy", "check", str(path)], out=out, err=err)
    return code, out.getvalue() + err.getvalue()


@pytest.mark.parametrize("under", ["mode", "source"])
def test_an_alias_bomb_is_refused_before_anything_walks_it(tmp_path: Path, under: str) -> None:
    """531,441 values from 300 bytes: refused at the alias that passes the bound, in one line.

    Before, `quote()` rendered the whole value into the error (312 M characters
    for 9**9), and a bomb under a source was walked until memory ran out.
    """
    path = tmp_path / "bomb.yaml"
    path.write_text(alias_bomb(6, under=under))
    code, output = check(path)
    assert code == 1
    # x5, the sixth line, passes the bound at its third alias (each *x4 holds 66,430).
    assert output == (
        f"{path}:6:25: holds more than {boundedyaml.MAX_VALUES:,} values with "
        "its aliases expanded\n"
    )


@pytest.mark.parametrize("depth", [65, 1000, 100_000])
@pytest.mark.parametrize("command", ["check", "explain", "rewrite"])
def test_deep_nesting_is_a_one_line_error_in_every_command(
    tmp_path: Path, depth: int, command: str
) -> None:
    """Not a RecursionError traceback: the file, line and column, and the limit.

    `rewrite` reads its manifests through the same loader: there the deep file is the input.
    """
    path, valid = tmp_path / "deep.yaml", tmp_path / "policy.yaml"
    path.write_text(nested(depth))
    valid.write_text(policies.POLICY)
    argv = {
        "check": ["policy", "check", str(path)],
        "explain": ["explain", "--policy", str(path), "nginx"],
        "rewrite": ["rewrite", "--policy", str(valid), "-f", str(path)],
    }[command]
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(argv, out=out, err=err)
    output = out.getvalue() + err.getvalue()
    assert code == (1 if command == "check" else 2)
    assert f"{path}:1:" in output
    # libyaml stops at 1,000 levels by itself; below that the loader's own bound speaks.
    assert (
        f"nested more than {boundedyaml.MAX_DEPTH} deep"
        if depth < 1000
        else "exceeded maximum nesting depth"
    ) in output
    assert len(output.splitlines()) == 1


def test_a_number_too_long_to_convert_is_named_by_position(tmp_path: Path) -> None:
    path = tmp_path / "number.yaml"
    path.write_text("mode: " + "9" * 100_000 + "\n")
    code, output = check(path)
    assert code == 1
    assert output == f"{path}:1:7: not valid YAML: a number of 100,000 digits (at most 4,300)\n"


def test_a_policy_larger_than_a_configmap_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "huge.yaml"
    path.write_bytes(policies.POLICY.encode() + b"#" * policyfile.MAX_POLICY_BYTES)
    code, output = check(path)
    assert code == 1
    assert output == (
        f"{path}: larger than {policyfile.MAX_POLICY_BYTES:,} bytes; a policy "
        "is at most that (a ConfigMap's limit)\n"
    )


def test_a_policy_of_thousands_of_errors_lists_the_first_and_counts_the_rest(
    tmp_path: Path,
) -> None:
    path = tmp_path / "many.yaml"
    path.write_text("mirrors:\n" + "  - 1\n" * 5000)
    code, output = check(path)
    assert code == 1
    lines = output.splitlines()
    assert lines[0] == f"{path}: invalid policy (5,000 errors):"
    assert lines[1] == "  mirrors[0]: must be a mapping with source and mirror, got a number"
    assert lines[1 + policyfile.MAX_ERRORS_SHOWN :] == ["  … and 4,950 more"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param(
            "mode: &a [*a]\n",
            ":1:11: alias *a refers to a value that contains it",
            id="self-reference",
        ),
        pytest.param(
            "mode: *nowhere\n",
            ":1:7: alias *nowhere names no anchor before it",
            id="undefined-alias",
        ),
        pytest.param(
            "mode: audit\n---\nmode: enforce\n",
            ": 2 YAML documents; a policy is one",
            id="two-documents",
        ),
    ],
)
def test_other_refusals_name_file_and_place(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    assert check(path) == (1, f"{path}{message}\n")


def test_aliases_within_the_bound_still_load(tmp_path: Path) -> None:
    """Anchors are ordinary YAML: a policy that reuses a namespace list through one loads."""
    path = tmp_path / "policy.yaml"
    path.write_text(
        "mirrors:\n"
        "  - {source: docker.io, mirror: m.example/hub, credential: a}\n"
        "  - {source: quay.io, mirror: m.example/quay, credential: b}\n"
        "credentials:\n"
        "  a: {namespaces: &teams [team-a, team-b]}\n"
        "  b: {namespaces: *teams}\n"
    )
    loaded = policyfile.read_policy(path).policy
    assert loaded.grants["b"].namespaces == ("team-a", "team-b")


def test_file_polls_and_reloads_run_off_the_event_loop(tmp_path: Path) -> None:
    """While a reload is still working, the loop goes on serving (a timer here)."""
    path = tmp_path / "policy.yaml"
    path.write_text("one")
    entered, release, returned = threading.Event(), threading.Event(), threading.Event()

    def slow_reload() -> None:
        entered.set()
        release.wait(2.0)
        returned.set()

    async def scenario() -> bool:
        watcher = FileWatcher([str(path)], slow_reload, interval=0.01)
        watcher.start()
        path.write_text("two")
        try:
            while not entered.is_set():
                await asyncio.sleep(0.01)
            # On the loop, the reload would have run to its end before this line.
            ran_beside_it = not returned.is_set()
        finally:
            release.set()
            watcher.stop()
        return ran_beside_it

    assert asyncio.run(scenario())
