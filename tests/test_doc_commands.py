"""Every `mirrorgate ...` command line that README.md and docs/ quote is one the CLI takes.

A reader copies these lines; once the CLI changes (a flag renamed, a file made a
positional argument) a stale one fails only in the reader's shell. Each is parsed here
by the real parser (`mirrorgate.webhook.cli.build_parser`), wherever it is quoted: a
fenced block, inline code in the prose or a table, or after a container image whose
entrypoint is the CLI (`podman run ... ghcr.io/mirrorgate/mirrorgate:0.1.0 policy check`).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from mirrorgate.webhook import cli

REPOSITORY = Path(__file__).resolve().parents[1]
PAGES = [REPOSITORY / "README.md", *sorted((REPOSITORY / "docs").glob("*.md"))]
SHELL_BLOCKS = {"sh", "console", "bash", "shell"}
# The CLI as a program (`mirrorgate`, `.venv/bin/mirrorgate`) or as an image's
# entrypoint (`ghcr.io/mirrorgate/mirrorgate:0.1.0`, `...@sha256:...`).
PROGRAM = re.compile(r"(?:.*/)?mirrorgate")
IMAGE = re.compile(r"\S+/mirrorgate(?::[\w.-]+|@sha256:\S+)")
# Where a shell command line ends.
SHELL_OPERATORS = {"|", "||", "&&", ";", "&"}
# Usage notation and elisions: the line is a synopsis or an excerpt, not a command.
SYNOPSIS = re.compile(r"[\[\]()|¦]|\.\.\.|…")
# A quote in prose may leave out what the command needs (`mirrorgate explain --probe`
# names an option, not a whole command); it may not write what the CLI refuses.
MENTION = "the following arguments are required"
# argparse reads a parser without changing it: one serves every check.
PARSER = cli.build_parser()


def quoted_lines(text: str) -> Iterator[tuple[str, str]]:
    """``(where, line)``: each line of a shell block, and each inline code span."""
    for language, block in re.findall(r"```(\w*)\n(.*?)```", text, re.S):
        if language in SHELL_BLOCKS:
            for line in block.replace("\\\n", " ").splitlines():
                yield "block", line.strip().removeprefix("$ ")
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    for span in re.findall(r"`([^`]+)`", prose):
        # Inside a table a code span writes `|` as `\|`: there it is the synopsis's "or",
        # never a pipe, so it must not end the command.
        yield "inline", " ".join(span.replace("\\|", "¦").split())


def arguments(line: str) -> list[str] | None:
    """The CLI's arguments in a shell line (what follows the program or the image), up
    to the end of that command; None when the line runs no mirrorgate command."""
    try:
        tokens = shlex.split(line, comments=True)
    except ValueError:
        return None
    commands = cli_commands(PARSER)
    for index, token in enumerate(tokens[:-1]):
        rest = tokens[index + 1 :]
        if (PROGRAM.fullmatch(token) or IMAGE.fullmatch(token)) and (
            rest[0] in commands or rest[0] in {"--version", "--help", "-h"}
        ):
            end = next(
                (i for i, t in enumerate(rest) if t in SHELL_OPERATORS or t[:1] in "<>"),
                len(rest),
            )
            return rest[:end]
    return None


def cli_commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """A parser's subcommands by name (none for a command that takes no subcommand)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def quoted_commands() -> list[tuple[str, str, list[str]]]:
    found = []
    for page in PAGES:
        for kind, line in quoted_lines(page.read_text()):
            args = arguments(line)
            if args is not None:
                found.append((f"{page.name} ({kind})", line, args))
    return found


def unknown_options(args: list[str]) -> list[str]:
    """The options in ``args`` that the command they are given to does not have."""
    parser = PARSER
    unknown = []
    for token in args:
        word = token.strip("[]()")
        commands = cli_commands(parser)
        if word in commands:
            parser = commands[word]
        elif re.match(r"--?[A-Za-z]", word) and word.split("=", 1)[0] not in (
            parser._option_string_actions
        ):
            unknown.append(word)
    return unknown


def refusal(args: list[str]) -> str | None:
    """argparse's error for ``args``, or None when it parses (or only prints help)."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            PARSER.parse_args(args)
    except SystemExit as exit_:
        return None if exit_.code == 0 else err.getvalue().strip()
    return None


COMMANDS = quoted_commands()


def test_the_scan_finds_commands_of_every_form() -> None:
    """Blocks, inline code and an image's entrypoint are all found (or the test below
    would prove nothing)."""
    kinds = {where.split(" ")[1] for where, _, _ in COMMANDS}
    assert kinds == {"(block)", "(inline)"}
    assert any(IMAGE.search(line) for _, line, _ in COMMANDS)
    assert any(args[:2] == ["policy", "check"] for _, _, args in COMMANDS)
    assert arguments("kubectl -n mirrorgate create secret generic x") is None
    assert arguments("helm install mirrorgate manifests/helm/mirrorgate") is None


def test_the_checks_catch_a_stale_policy_check() -> None:
    """`policy check` takes the file as its argument: `--policy FILE` is refused."""
    args = arguments("podman run --rm img/mirrorgate:0.1.0 policy check --policy /w/p.yaml")
    assert args == ["policy", "check", "--policy", "/w/p.yaml"]
    assert unknown_options(args) == ["--policy"]
    assert refusal(args) is not None
    assert refusal(["policy", "check", "/w/p.yaml"]) is None


@pytest.mark.parametrize(("where", "line", "args"), COMMANDS, ids=[c[1] for c in COMMANDS])
def test_every_quoted_command_is_one_the_cli_takes(where: str, line: str, args: list[str]) -> None:
    """Each option belongs to its command; a whole command line parses. A synopsis or an
    excerpt (`[...]`, `a|b`, `...`) is held to its options alone, and inline code may
    leave out a required argument, since prose names commands and options by it."""
    assert unknown_options(args) == [], where
    if SYNOPSIS.search(" ".join(args)):
        return
    refused = refusal(args)
    if where.endswith("(inline)") and refused is not None and MENTION in refused:
        return
    assert refused is None, where
