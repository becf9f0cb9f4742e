"""The parser agrees with the canonical Go package on the shared conformance corpus.

The corpus and its runner live in ``../shared/conformance`` beside the
checkout and stay there (they are reference data, not project data); this
test plugs the project's parser into the runner's adapter hook.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import re
import types
from typing import Any

import pytest

from mirrorgate.policy import reference
from tests.environment import skips_forbidden

CORPUS_DIR = pathlib.Path(
    os.environ.get(
        "MIRRORGATE_CONFORMANCE_DIR",
        pathlib.Path(__file__).resolve().parents[3] / "shared" / "conformance",
    )
)
# The APIs mirrorgate implements; the runner skips the others as unsupported.
APIS = "Parse,ParseNormalizedNamed,regexp:domain"


def _load_runner() -> types.ModuleType:
    script = CORPUS_DIR / "check_reference.py"
    if not script.exists():
        # The corpus is reference data beside the checkout, not in it: a fresh
        # clone has none, CI lays it out (and there it must run).
        where = (
            f"no corpus at {CORPUS_DIR} (CI lays it out beside the checkout; "
            "MIRRORGATE_CONFORMANCE_DIR=DIR names another place)"
        )
        if skips_forbidden():
            pytest.fail(
                f"conformance check required here (CI or MIRRORGATE_REQUIRE_E2E=1), but {where}"
            )
        pytest.skip(f"conformance check DID NOT RUN: {where}")
    spec = importlib.util.spec_from_file_location("check_reference", script)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _adapter(runner: types.ModuleType) -> Any:
    def adapter(target: object, api: str, text: str, args: dict[str, Any]) -> dict[str, Any]:
        try:
            if api == "Parse":
                ref = reference.parse(text)
            elif api == "ParseNormalizedNamed":
                ref = reference.parse_normalized(text)
            elif api == "regexp:domain":
                if not reference.is_valid_domain(text):
                    raise runner.Rejected(None, "no match")
                return {}
            else:
                raise runner.Unsupported(api)
        except reference.InvalidReferenceError as error:
            raise runner.Rejected(error.code, str(error)) from error
        return {
            "kind": "named",
            "name": ref.name,
            "domain": ref.domain,
            "path": ref.path,
            "tag": ref.tag,
            "digest": ref.digest,
            "normalized": str(ref),
            "familiar_name": ref.familiar_name,
            "familiar": ref.familiar,
        }

    return adapter


# The shared runner opens the corpus without closing it; that ResourceWarning is
# the runner's, not ours.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_agrees_with_distribution_reference(capsys: pytest.CaptureFixture[str]) -> None:
    """Every unflagged Parse/ParseNormalizedNamed case agrees with the Go package."""
    runner = _load_runner()
    runner.adapter = _adapter(runner)  # type: ignore[attr-defined]  # the hook we plug into
    status = runner.main(
        [
            "mirrorgate.policy.reference:parse",
            "--api",
            APIS,
            "--cases",
            str(CORPUS_DIR / "reference_cases.json"),
            "-v",
        ]
    )
    out = capsys.readouterr()
    assert status == 0, out.out + out.err
    assert " 0 skipped as unsupported" in out.out
    # All 97 ParseNormalizedNamed cases ran and passed (none skipped, none failed).
    assert re.search(r"^ParseNormalizedNamed\s+97\s+0\s+0$", out.out, re.MULTILINE), out.out
