"""What the plugin host's socket adds to a plugin run: ``python -m bench.plugin_host_bench``.

The real Go test plugin (it mints a login from the test token server over
HTTPS, as a cloud plugin asks its STS) is run N times through a
:class:`~mirrorgate.webhook.credentials.pluginrunner.LocalRunner` in this
process and N times through a real ``mirrorgate plugin-host`` and its socket,
in alternating rounds so that the machine's load weighs on both alike. The
report is the median and 90th percentile of each, per round.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from mirrorgate.webhook.credentials import pluginhost, providerconfig
from mirrorgate.webhook.credentials.pluginrunner import LocalRunner, PluginRunner
from tests.e2e.harness.plugins import plugin_host
from tests.e2e.harness.providers import start_issuer

IMAGE = "a.example/team-a/app:1"


def _round(runner: PluginRunner, provider: providerconfig.CredentialProvider, n: int) -> str:
    times = []
    for _ in range(n):
        started = time.perf_counter()
        finished = runner.run(provider, IMAGE)
        times.append(time.perf_counter() - started)
        assert finished.returncode == 0, finished.stderr
    times.sort()
    return (
        f"median {1000 * statistics.median(times):.1f} ms, "
        f"p90 {1000 * times[int(0.9 * (n - 1))]:.1f} ms"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30, help="runs per round (default: 30)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of each (default: 2)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as work:
        issuer = start_issuer(Path(work, "issuer"))
        try:
            issuer.add_robot("robot-a", "team-a")
            config = issuer.write_config(
                Path(work, "providers.json"), issuer.provider("bench-provider", "robot-a")
            )
            provider = providerconfig.load(config).providers["bench-provider"]
            with plugin_host(Path(work), config, issuer.bin_dir) as (_, socket_path):
                runners: dict[str, PluginRunner] = {
                    "in this process": LocalRunner(issuer.bin_dir, timeout=10),
                    "through the plugin host": pluginhost.HostClient(socket_path, timeout=10),
                }
                for round_ in range(1, args.rounds + 1):
                    for name, runner in runners.items():
                        print(f"round {round_}, {name}: {_round(runner, provider, args.runs)}")
        finally:
            issuer.server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
