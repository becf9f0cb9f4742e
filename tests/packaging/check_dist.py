"""The packaging check `make test` runs: what a user gets from the sdist and the wheel.

    python -m tests.packaging.check_dist [--single-package]

1. builds the sdist, then the wheel from it (``python -m build``), with no
   setuptools deprecation warning;
2. installs the wheel into a clean virtualenv and runs ``mirrorgate --help``
   and ``--version`` from it, and checks the SPDX license and its file;
3. installs the source tree itself, non-editable, into that virtualenv;
4. checks that none of this left anything in the source tree.

``--single-package`` also requires that the wheel installs exactly one
top-level import package, ``mirrorgate``, and no ``policy``, ``webhook`` or
``certs`` (see :func:`check_single_package`; on once the packages are mapped
under that name).

Exit 0 when every check passes; otherwise 1 and one line per failure.
"""

from __future__ import annotations

import argparse
import email.parser
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((REPOSITORY / "pyproject.toml").read_text())["project"]
GENERIC_NAMES = ("policy", "webhook", "certs")


class CheckFailed(Exception):
    """One packaging check that did not hold."""


def run(*argv: str | Path, cwd: Path = REPOSITORY) -> str:
    done = subprocess.run(
        [str(a) for a in argv], cwd=cwd, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise CheckFailed(
            f"{' '.join(map(str, argv))} exited {done.returncode}:\n{done.stdout}{done.stderr}"
        )
    return done.stdout + done.stderr


def tree_state() -> set[str]:
    """Every changed, new or ignored path of the work tree, as git reports it."""
    return set(run("git", "status", "--porcelain", "--ignored").splitlines())


def build(out: Path) -> tuple[Path, Path]:
    """The sdist and the wheel built from it; a deprecation warning is a failure."""
    log = run(sys.executable, "-m", "build", "--outdir", out, REPOSITORY)
    warnings = [line for line in log.splitlines() if "Deprecat" in line]
    if warnings:
        raise CheckFailed("the build warns:\n" + "\n".join(warnings))
    [sdist] = out.glob("*.tar.gz")
    [wheel] = out.glob("*.whl")
    return sdist, wheel


def site_packages(venv: Path) -> Path:
    [found] = venv.glob("lib/python3*/site-packages")
    return found


def check_installed_wheel(venv: Path) -> None:
    """`mirrorgate --help` and `--version` run; the license is SPDX, with its file."""
    mirrorgate = venv / "bin" / "mirrorgate"
    if not run(mirrorgate, "--help", cwd=venv).startswith("usage: mirrorgate"):
        raise CheckFailed("mirrorgate --help from the wheel printed no usage")
    version = run(mirrorgate, "--version", cwd=venv).strip()
    if version != f"mirrorgate {PROJECT['version']}":
        raise CheckFailed(f"mirrorgate --version printed {version!r}")
    [dist_info] = site_packages(venv).glob("mirrorgate-*.dist-info")
    metadata = email.parser.Parser().parsestr((dist_info / "METADATA").read_text())
    if metadata["License-Expression"] != "Apache-2.0":
        raise CheckFailed(f"License-Expression is {metadata['License-Expression']!r}")
    if not (dist_info / "licenses" / "LICENSE").read_text().lstrip().startswith("Apache License"):
        raise CheckFailed("the wheel carries no Apache-2.0 LICENSE file")


def check_single_package(site: Path) -> None:
    """The install adds one import package, ``mirrorgate``, and none of the generic names."""
    generic = [name for name in GENERIC_NAMES if (site / name).exists()]
    if generic:
        raise CheckFailed(
            f"site-packages has top-level {', '.join(generic)}: they belong under mirrorgate"
        )
    if not (site / "mirrorgate" / "__init__.py").is_file():
        raise CheckFailed("site-packages has no mirrorgate package")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--single-package",
        action="store_true",
        help="require one top-level import package, mirrorgate",
    )
    args = parser.parse_args(argv)
    before = tree_state()
    try:
        with tempfile.TemporaryDirectory(prefix="mirrorgate-dist-") as scratch:
            work = Path(scratch)
            _, wheel = build(work / "dist")
            venv = work / "venv"
            run(sys.executable, "-m", "venv", venv)
            pip = venv / "bin" / "pip"
            run(pip, "install", "--quiet", wheel, cwd=work)
            check_installed_wheel(venv)
            if args.single_package:
                check_single_package(site_packages(venv))
            # A user's `pip install .` of a clone: non-editable, from the tree itself.
            run(pip, "install", "--quiet", "--no-deps", "--force-reinstall", REPOSITORY, cwd=work)
            check_installed_wheel(venv)
        left = sorted(tree_state() - before)
        if left:
            raise CheckFailed("building and installing left in the source tree: " + ", ".join(left))
    except CheckFailed as failure:
        print(f"check_dist: {failure}", file=sys.stderr)
        return 1
    print(
        f"check_dist: sdist and wheel of mirrorgate {PROJECT['version']} build, install and "
        "run; the source tree is untouched",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
