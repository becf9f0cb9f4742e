"""How the tests run mirrorgate's command line as a real process."""

import sys

# The interpreter of the test run, so the process sees the same installed
# packages; `-m` rather than the `mirrorgate` script, which a virtualenv that
# is not activated may not have on PATH.
MIRRORGATE = (sys.executable, "-m", "mirrorgate.webhook.cli")
