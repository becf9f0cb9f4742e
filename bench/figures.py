"""Render the benchmark figures of docs/development.md from bench/results.json (the last runs).

    python -m bench.figures            # rewrite docs/development.md between the markers
    python -m bench.figures --check    # exit 1 if docs/development.md is not what the results give

`make bench`, `make bench-policy` and `make bench-secrets` record their
reports (bench/results.py) and then run this, so that the figures
are always those of the last run, never typed by hand.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench import results

__all__ = ["BEGIN", "END", "render", "render_figures"]

TARGET = Path(__file__).resolve().parents[1] / "docs" / "development.md"
BEGIN = "<!-- figures:begin (written by `python -m bench.figures` from bench/results.json) -->"
END = "<!-- figures:end -->"

# Each section: its results key, then how it was measured (figures come from the run).
SECTIONS: tuple[tuple[str, str], ...] = (
    (
        "planning",
        """\
**Planning cost**: CPU µs per Pod for `policy.plan`, min of the repeats;
*steady* repeats images as a cluster does, *cold* makes every image string
unique.""",
    ),
    (
        "server",
        """\
**Admission server**: the real HTTPS server on loopback against a *floor*, a
minimal Starlette app under the same uvicorn settings, event loop (uvloop) and
TLS context that parses the review and returns a fixed one-operation patch; it
has none of mirrorgate's connection limits, so their cost counts as
mirrorgate's. Keep-alive connections in a
closed loop, alternating rounds; server CPU per admission from
`/proc/<pid>/stat`. Every mirrorgate response is checked to carry its patch,
and the process has no outbound connection. What made it fast, each step
measured: plans shared between Pods of the same shape (the replicas of a
workload) and with them their encoded patch, image resolutions kept in the
admission cache, the admission endpoints as lean ASGI handlers that a POST
reaches past Starlette's middlewares and route matching, one log line
written without the logging module's per-record machinery and flushed once a
second, per-admission metrics as plain counters exported at scrape time,
`gc.freeze()` after start-up and a higher collection threshold, orjson.""",
    ),
    (
        "policy-objects",
        """\
**A MirrorPolicy change to admission**: a real etcd and kube-apiserver, 1,000
namespaces each holding a MirrorPolicy, mirrorgate serving the objects alone
(no policy file); one MirrorPolicy's mirror is patched at a time, and dry-run
Pods are created in its namespace until one carries the new mirror. The wait
is the watch event, one composition of every object, the swap and an
admission: the composition dominates it (its in-process cost is the policy
bench's).""",
    ),
    (
        "secrets",
        """\
**With pull secrets**: a real etcd and kube-apiserver with an audit log, the
kubernetes credential store, every image needing a credential whose Secret
already exists; then the first Pod of new namespaces, through the API server,
with and without the webhook (the Secret is created during admission). In
steady state the audit log should show no Secret request by mirrorgate: only
Lease renewals and the leader's periodic re-assertion (one unchanged PUT per
copy per `--reconcile-interval`, no write in etcd), not admission. Making a
copy for the first Pod of a namespace is three API calls (claim the record,
create the Secret, record its uid), the price of reading no Secret outside
mirrorgate's namespace; the first Pod of any fresh namespace costs the API
server far more than that, with or without a webhook. In the same run, the
first Pods of new namespaces whose credential has `delivery: kubelet`: the
image is rewritten and no Secret is made, so no API call is on the
admission path.""",
    ),
    (
        "abuse",
        """**Under abuse**: the real HTTPS server with its default limits: its RSS with
1,000 idle keep-alive TLS connections open and after they close, an ordinary
admission's latency while they are open, and the RSS growth after a flood of
reviews each carrying a different 2.5 MB image (answered "invalid" with a
bounded warning, kept in no memo). See
[Security](security.md#limits-what-any-client-can-make-the-server-hold) for the limits.""",
    ),
    (
        "abuse-loop",
        """\
**Big Pods and policy reloads**: the real HTTPS server under the same
benchmark, beside the previous version's code (`--before`, a checkout of it
served by the same interpreter): normal admissions over one keep-alive
connection while three processes send 3 MB Pods of 50,000 containers back to
back, then `mirrorgate policy check` and a live reload of a 1 MiB policy of
valid rules and of three files built to hurt (YAML alias bombs, 100,000-deep
nesting), with normal admissions timed for 3 s from each file's replacement.
The reload verdict includes up to one `--reload-interval` (1 s) of polling.""",
    ),
    (
        "abuse-pinned",
        """\
**Pinned by unread answers**: the real HTTPS server with its default limits
while another process holds the connection limit's worth of connections,
each pipelining 1,000 `GET /metrics` that it never reads, and opens a new
one whenever the server closes one. Beside them, a keep-alive client already
in use goes on with its admissions and fresh connections make one each.
*before* is the previous version under the same run, in the same sitting
(`--baseline-server`).""",
    ),
    (
        "abuse-policy-review",
        """\
**Hostile policy reviews**: the real HTTPS server with its default limits
while three processes post reviews of the policy ConfigMap to
`/validate-policy` back to back (anyone who reaches the port can): the
largest policy a review may carry (128 KiB of valid rules), an alias bomb,
and nesting as deep as that size allows. Beside them one client makes
ordinary Pod admissions over a keep-alive connection; the same client alone,
just before, is the baseline. A review over 8 KiB is judged in the review
worker process (`webhook/edge/offload.py`), one at a time, so that it does
not hold the interpreter's lock the admissions need; every hostile answer is
checked (allowed, or denied naming the bound).""",
    ),
    (
        "abuse-attacks",
        """**Attacks beside a victim** (issue 29): the real HTTPS server with its
default limits while attacker processes send, for 15 s: pipelined 7 MiB
reviews whose answers they never read (beside a client of 3 MiB reviews
that reads), 6.9 MB of 1,000-deep nested lists, 2.3 million empty lists,
6.9 MB reviews whose whitespace is line feeds, 1 MB bodies in 1-byte chunks
(`bench/abuse_attacks.py`). Beside each, one client of 2 KB Pod reviews over
a keep-alive connection; the same client alone just before, on the same
server, is that attack's baseline. *before* is the previous version's
server under the same run, in the same sitting (`--baseline-server`): the
code before issue 29. Targets: victim p99 ≤ 100 ms and none over 1 s, no
legitimate review dropped or answered past the webhook's 5 s, each attack's
own answers within 5 s (an answer may be a refusal naming the bound the
attack crossed). A client refused for its count of chunks is refused while
most of its body is still to come; the chunk senders read while they send,
as HTTP clients such as Go's do, and stop at the refusal. The server waits
for the rest of such a body at most its TLS shutdown timeout (2 s), so a
sender that cannot read in time sees the connection closed (SSLEOFError).""",
    ),
    (
        "abuse-policy-queue",
        """**Policy-queue flood** (issue 29): six callers, each from a loopback
address of its own, post reviews of a valid 120 KB policy to
`/validate-policy` back to back, beside one caller writing a 16 KB policy;
the same caller alone just before is the baseline (`bench/policy_queue_bench.py`).
Policy reviews take turns by caller (`webhook/edge/fairqueue.py`). Targets: no
legitimate update refused unjudged, each within the webhook's 5 s, and the
flood's own answers within 5 s. *baseline* here is the previous version's
server in the same sitting (`--baseline-server`).""",
    ),
    (
        "kubelet",
        """\
**Secretless pulls**: a real etcd and kube-apiserver, mirrorgate with
`--kubelet-port`, Pod-bound tokens from TokenRequest and a kubelet certificate
from the API server's client CA (`bench/kubelet_bench.py`). The round trip is
the real `mirrorgate-credential-provider` run as the kubelet runs it, a process
per pull, from its start to its exit with the login: *warm* when the token's
verdict is kept, *cold* when each pull carries a token never seen (a
TokenReview each), alternating in the same rounds. Throughput: the server
pinned to one CPU, kept-alive clients, warm verdicts, every answer checked.""",
    ),
    (
        "pods",
        """\
**Pod start on a real node**: the e2e suite's node (kubelet, containerd),
mirrorgate installed in it from its image by its chart, one Pod at a time,
from just before the create call to the moment the container's process
began (it prints its own clock). Both series pull the same image through the
same authenticated mirror: the *baseline* names the
mirror image with a hand-made Secret in a namespace mirrorgate does not see;
*mirrorgate* names the upstream image in an `enforce` namespace and is
rewritten, its Secret already there. The create call is the only step
mirrorgate changes; the node does the same work for both. A third series,
the baseline again in the same rounds, is the run's noise floor: a
difference smaller than that is not a finding. With fewer than 100 Pods a
p99 is the largest sample.""",
    ),
    (
        "objects",
        """\
**Policy as objects** (`bench/objects_bench.py`, in-process): a
ClusterMirrorPolicy of 10 rules and a robot credential per team, alone and
with a MirrorPolicy in each of 1,000 namespaces (the team's own docker.io
rule on its Harbor project, with its robot), in one run. `compose` is the
CPU time of composing every object (what a replica does when one of them or
a namespace's labels change); the memory is what the composition and the
admission cache hold (`tracemalloc`). Admission CPU per Pod: a 5-container
Pod admitted in each namespace in turn, through the admission cache, which
keeps plans by (policy, shape), so Pods of a thousand namespace policies hit
as Pods of one policy do; and, in the same run, through a cache of one policy
at a time, as the admission cache was before (a Pod of another namespace's
policy than the last empties it: the 10.7× of issue 30). A MirrorPolicy
changed: composed again with the last composition, every other namespace
keeps its policy object, and with it its plans. Here the cache holds 6,000
entries (a plan and 5 resolutions per namespace) of its one bound of 8,192:
with Pods of more namespace policies than that, in turn, it empties and
refills as under any workload past its bound.""",
    ),
    (
        "health",
        """\
**Health probing**: two `mirrorgate serve` processes on the same policy, one
probing a real TLS mirror on loopback every second (ten times the default
rate), the other with `--no-health-probes`; alternating rounds, server CPU per
admission, target ≤ 1.05×. The mirror's access log counts every request
mirrorgate sent it while the probing server was being measured, warm-ups
included (its probes carry the user agent `mirrorgate-health`), against the
probe rounds that time allows and the admissions answered: no admission makes
a network call.
`tests/webhook/test_health.py` shows the same with an audit hook: no socket
connect or name lookup while admissions are decided under healthy, down and
failing states.""",
    ),
)


def render_figures(recorded: Mapping[str, Any]) -> str:
    """The text between the markers."""
    parts = [
        "This machine is shared and noisy; every figure is a ratio against a baseline "
        "measured in the same run, and each section names the run it comes from."
    ]
    for key, method in SECTIONS:
        parts.append(method)
        found = recorded.get(key)
        if found is None:
            parts.append("*Not measured yet: run `make bench`.*")
            continue
        parts.append(f"From `{found['command']}` on {found['measured']} ({found['cpus']} CPUs):")
        parts.append(found["report"])
    return "\n\n".join(parts)


def render(document: str, recorded: Mapping[str, Any]) -> str:
    """``document`` with the text between the markers replaced."""
    head, begin, rest = document.partition(BEGIN)
    _, end, tail = rest.partition(END)
    if not begin or not end:
        raise ValueError(f"{TARGET.name} lacks the markers {BEGIN!r} … {END!r}")
    return f"{head}{BEGIN}\n{render_figures(recorded)}\n{END}{tail}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.figures", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit 1 if docs/development.md differs from what the results give",
    )
    args = parser.parse_args(argv)
    current = TARGET.read_text()
    wanted = render(current, results.load())
    if args.check:
        if wanted != current:
            print(
                "docs/development.md figures are stale: run python -m bench.figures",
                file=sys.stderr,
            )
            return 1
        return 0
    if wanted != current:
        TARGET.write_text(wanted)
        print("docs/development.md figures rewritten from bench/results.json", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
