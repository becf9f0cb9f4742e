"""Where a missing prerequisite must fail the run rather than skip a test."""

import os


def skips_forbidden() -> bool:
    """True in CI (``CI`` set to anything but empty, 0, false or no) or with
    ``MIRRORGATE_REQUIRE_E2E=1``, as `make test` sets: there a test that
    cannot run is a failure, never a silent skip."""
    if os.environ.get("MIRRORGATE_REQUIRE_E2E") == "1":
        return True
    return os.environ.get("CI", "").lower() not in ("", "0", "false", "no")
