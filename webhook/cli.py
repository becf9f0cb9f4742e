"""The `mirrorgate` command line: the parser, and dispatch to the commands in ``commands/``.

Exit codes, for every command: 0 fine, 1 findings (warnings, invalid images,
an invalid policy under `policy check`), 2 usage or configuration error with
a one-line message naming what is wrong. Never a traceback. `serve` exits 0
after SIGTERM (once the requests in flight are answered), 130 after Ctrl-C,
and 2 when its port is busy.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from mirrorgate.webhook.commands import (
    EXIT_OK,
    EXIT_USAGE,
    Command,
    certs,
    cluster_audit,
    credentials,
    export,
    export_crio,
    migrate,
    offline,
    plugin_host,
)
from mirrorgate.webhook.commands import explain as explain_command
from mirrorgate.webhook.commands.serve import settings
from mirrorgate.webhook.credentials.store import StoreError
from mirrorgate.webhook.errors import ConfigError
from mirrorgate.webhook.version import VERSION

__all__ = ["build_parser", "main"]


def _serve(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    # uvicorn and the app load only for this command
    from mirrorgate.webhook.commands.serve import process

    return process.run(args, out, err)


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (exit 2) that name the command."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _mode_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--mode",
        choices=offline.MODES,
        default=offline.ENFORCE,
        help="the namespace's mirrorgate.io/mode label; audit also when the "
        "server runs --audit-only (default: %(default)s)",
    )


def _group(
    commands: argparse._SubParsersAction[Any],
    name: str,
    text: str,
    *,
    description: str | None = None,
    dest: str | None = None,
    metavar: str = "COMMAND",
) -> argparse._SubParsersAction[Any]:
    """A command that only groups subcommands (`mirrorgate policy check`, ...)."""
    group = commands.add_parser(name, help=text, description=description)
    subcommands: argparse._SubParsersAction[Any] = group.add_subparsers(
        dest=dest or f"{name}_command", metavar=metavar, parser_class=_Parser
    )
    subcommands.required = True
    return subcommands


def _store_arguments(
    parser: argparse.ArgumentParser,
    *,
    required: bool = False,
    text: str | None = None,
) -> None:
    """The file store and its key: serve's ``--store-file`` and ``--key-file``, given as
    ``--store FILE`` here (serve's ``--store`` names the kind of store)."""
    settings.add_flag(parser, "store_file", flag="--store", required=required, text=text)
    settings.add_flag(parser, "store_key_file", dest="key_file")


def _source_arguments(parser: argparse.ArgumentParser) -> None:
    """Where credentials come from, as serve's options say (`credentials check` resolves as
    serve does); the context and key file under the names the credentials commands read."""
    dests = {"kube_context": "context", "store_key_file": "key_file"}
    for name in settings.SOURCE_FLAGS:
        if name == "store":  # no store at all is serve's alone
            settings.add_flag(parser, name, choices=("kubernetes", "file"))
        else:
            settings.add_flag(parser, name, dest=dests.get(name))


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="mirrorgate",
        description=(
            "Rewrite Pod images to authenticated registry mirrors at admission, "
            "with matching pull secrets."
        ),
    )
    parser.add_argument("--version", action="version", version=f"mirrorgate {VERSION}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True

    rewrite = commands.add_parser(
        "rewrite",
        help="print Pods, and workloads' Pods, as mirrorgate would admit them (offline)",
        description="Print each Pod as it would be admitted (or its JSON Patch); warnings go "
        "to stderr. A workload (Deployment, StatefulSet, DaemonSet, ReplicaSet, "
        "ReplicationController, Job, CronJob, PodTemplate) comes out as the Pod "
        "its controller would create, as admitted: templates themselves are never "
        "mutated. Other objects are passed over. With --mode audit Pods come out "
        "unchanged and every planned rewrite is a warning. Exit 1 when there are "
        "warnings, 2 when the input has no Pod and no workload.",
    )
    rewrite.add_argument("--policy", required=True, metavar="FILE", help="policy YAML file")
    rewrite.add_argument(
        "-n", "--namespace", help="namespace to plan for (default: the Pod's own, else 'default')"
    )
    _mode_argument(rewrite)
    rewrite.add_argument("-o", "--output", choices=("yaml", "json", "patch"), default="yaml")
    rewrite.add_argument(
        "-f",
        "--filename",
        default="-",
        metavar="FILE",
        help="Pod manifests, YAML or JSON ('-' for stdin, the default); "
        "a directory: its .json, .yaml and .yml files in name order",
    )
    rewrite.set_defaults(run=offline.run_rewrite)

    explain = commands.add_parser(
        "explain",
        help="explain what mirrorgate makes of image references",
        description="Print one JSON object per image, in order: what admission would do with "
        "it in a Pod of the namespace. `outcome` is one of excluded, skipped, "
        "invalid, no-rule, already-mirrored, pull-policy-never, not-granted, rewrite "
        "(null without --policy); `chain` lists the rules passed over (onNotGranted: "
        "next); with -o table, one row per image instead. Exit 1 when an "
        "image is invalid or admission would warn about it.",
    )
    explain.add_argument("--policy", metavar="FILE", help="policy YAML file (optional)")
    explain.add_argument(
        "-n",
        "--namespace",
        default=offline.DEFAULT_NAMESPACE,
        help="the Pod's namespace (default: %(default)s)",
    )
    explain.add_argument(
        "-l",
        "--label",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a label of the Pod, e.g. mirrorgate.io/skip=true (repeatable)",
    )
    explain.add_argument(
        "--namespace-label",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a label of the namespace, for grants by namespaceSelector (repeatable)",
    )
    explain.add_argument(
        "--pull-policy",
        choices=("Always", "IfNotPresent", "Never"),
        help="the container's imagePullPolicy (Never: left as written under skipPullPolicyNever)",
    )
    _mode_argument(explain)
    explain.add_argument(
        "--probe",
        action="store_true",
        help="probe the mirrors of the images' rules once (GET /v2/, no login) and choose "
        "among a rule's mirrors as admission would; without it every mirror counts as up",
    )
    explain.add_argument(
        "-o", "--output", choices=("json", "table"), default="json", help="(default: %(default)s)"
    )
    explain.add_argument("images", nargs="+", metavar="IMAGE")
    explain.set_defaults(run=explain_command.run_explain)

    policy_commands = _group(commands, "policy", "work with policy files")
    check = policy_commands.add_parser(
        "check",
        help="validate a policy file",
        description="Validate a policy file and list every error with its field path. "
        "Exit 1 when it is invalid, or when --store is given and a credential the "
        "policy uses is missing from it or is for another host than its mirror.",
    )
    check.add_argument("file", metavar="FILE")
    _store_arguments(
        check,
        text="also check the policy's credentials against this "
        "encrypted credential store (offline)",
    )
    check.set_defaults(run=offline.run_policy_check)
    migrate_command = policy_commands.add_parser(
        "migrate",
        help="print the ClusterMirrorPolicy for a policy file",
        description="Print the ClusterMirrorPolicy whose spec is the policy FILE (its text "
        "and comments kept), for `kubectl apply -f -`. FILE may be the mirrorgate-policy "
        "ConfigMap as `kubectl get -o yaml` prints it, or - for standard input.",
    )
    migrate_command.add_argument("file", metavar="FILE")
    migrate_command.add_argument(
        "--name",
        default=migrate.DEFAULT_NAME,
        help="the object's name (default: %(default)s)",
    )
    migrate_command.set_defaults(run=migrate.run)

    serve = commands.add_parser(
        "serve",
        help="run the HTTPS admission webhook",
        description="Serve /mutate (enforce), /audit (dry-run audit), /healthz, /readyz and "
        "/metrics over HTTPS. The policy and certificate files are reloaded when "
        "they change.",
    )
    settings.add_flags(serve)
    serve.set_defaults(run=_serve)

    host = commands.add_parser(
        "plugin-host",
        help="run the credential-provider plugins for serve, in a container of their own",
        description="Listen on a unix socket and run, for each request of serve "
        "--credential-provider-socket, the credential-provider plugin the config names, "
        "one at a time, with an allow-listed environment, and send back its output. Run it "
        "in a container that holds no API token of mirrorgate's, only the plugins' cloud "
        "identity. Exits 0 on SIGTERM.",
    )
    plugin_host.add_arguments(host)
    host.set_defaults(run=plugin_host.run)

    credentials.add_commands(
        _group(
            commands, "credentials", "the encrypted file credential store; check any credential"
        ),
        store_arguments=_store_arguments,
        source_arguments=_source_arguments,
    )

    certs_commands = _group(commands, "certs", "CA and serving certificates")
    generate = certs_commands.add_parser(
        "generate",
        help="write a CA and a serving certificate for the webhook Service",
        description="Write ca.crt, ca.key, tls.crt and tls.key into DIR (keys 0600, replaced "
        "atomically) and print the caBundle. An existing valid CA in DIR is "
        "reused, so the caBundle stays the same.",
    )
    generate.add_argument("--service", required=True, metavar="NAME")
    generate.add_argument("--namespace", required=True, metavar="NS")
    generate.add_argument("--out", required=True, metavar="DIR")
    generate.add_argument(
        "--dns", action="append", default=[], metavar="NAME", help="extra DNS name (repeatable)"
    )
    generate.add_argument(
        "--ip", action="append", default=[], metavar="IP", help="extra IP address (repeatable)"
    )
    generate.set_defaults(run=certs.run_generate)
    inject = certs_commands.add_parser(
        "inject",
        help="set caBundle on a MutatingWebhookConfiguration",
        description="Set caBundle (base64 of the CA PEM, exactly once) on every webhook of "
        "the MutatingWebhookConfiguration NAME.",
    )
    inject.add_argument("--webhook-config", required=True, metavar="NAME")
    inject.add_argument("--ca", required=True, metavar="FILE", help="CA certificate (PEM)")
    inject.add_argument("--kubeconfig", metavar="FILE")
    inject.add_argument("--context")
    inject.set_defaults(run=certs.run_inject)

    audit_command = commands.add_parser(
        "audit",
        help="report what the policy would do to the Pods in a cluster (read-only)",
        description="List Pods through the API and report, per namespace and overall, the "
        "images already on a mirror, those the policy would rewrite (old → new), "
        "those no rule covers, those left alone for want of a credential grant, "
        "invalid references, and excluded images and namespaces. Needs only list "
        "on pods and namespaces, and without --policy on clustermirrorpolicies and "
        "mirrorpolicies. Exit 1 when --fail-on trips, 2 on errors. "
        "The JSON schema is in webhook/commands/audit_report.py's docstring.",
    )
    audit_command.add_argument(
        "--policy",
        metavar="FILE",
        help="policy YAML file (default: the cluster's ClusterMirrorPolicy and "
        "MirrorPolicy objects, composed per namespace as the server does)",
    )
    audit_command.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="kubeconfig (default: $KUBECONFIG or ~/.kube/config, "
        "else the in-cluster service account)",
    )
    audit_command.add_argument("--context", metavar="NAME", help="kubeconfig context")
    scope = audit_command.add_mutually_exclusive_group()
    scope.add_argument(
        "-A", "--all-namespaces", action="store_true", help="every namespace (the default)"
    )
    scope.add_argument(
        "-n",
        "--namespace",
        dest="namespaces",
        action="extend",
        nargs="+",
        metavar="NS",
        help="only these namespaces (repeatable)",
    )
    audit_command.add_argument("-o", "--output", choices=("table", "json"), default="table")
    audit_command.add_argument(
        "--no-health",
        dest="health",
        action="store_false",
        help="do not probe the mirrors of planned rewrites (by default "
        "each is probed once, GET /v2/, and its health shown "
        "beside them)",
    )
    audit_command.add_argument(
        "--fail-on",
        choices=tuple(cluster_audit.FAIL_ON),
        help="exit 1 if any container is unmirrored (not on a mirror, "
        "excluded ones aside) or, with 'rewrites', would be "
        "rewritten",
    )
    audit_command.set_defaults(run=cluster_audit.run)

    runtimes = _group(
        commands,
        "export",
        "the policy's mirrors as containerd or CRI-O configuration",
        description="Write the policy's mirrors as container-runtime "
        "configuration, for runtimes that should pull through the "
        "mirrors themselves.",
        dest="export_runtime",
        metavar="RUNTIME",
    )
    containerd = runtimes.add_parser(
        "containerd",
        help="write <registry>/hosts.toml files for containerd's config_path",
        description="Write DIR/<registry>/hosts.toml for each source registry (point the CRI "
        "plugin's registry config_path at DIR). Rules containerd cannot express "
        "(repository paths, wildcards) are reported on stderr and left out; exit 1 "
        "then. Credentials are never written.",
    )
    containerd.add_argument("--policy", required=True, metavar="FILE", help="policy YAML file")
    containerd.add_argument(
        "--out",
        required=True,
        metavar="DIR",
        help="directory to write into, e.g. /etc/containerd/certs.d",
    )
    containerd.add_argument(
        "--mirror-ca",
        metavar="FILE",
        help="a PEM bundle of your mirrors' private CAs (serve's --mirror-ca, the chart's "
        "mirrorCA): every verified HTTPS mirror without a caFile trusts it, copied as "
        f"{export.MIRROR_CA_FILE} beside its hosts.toml",
    )
    containerd.set_defaults(run=export.run_containerd)
    cri_o = runtimes.add_parser(
        "cri-o",
        help="print a registries.conf drop-in for CRI-O",
        description=f"Print a containers-registries.conf v2 drop-in (install it as "
        f"{export_crio.CRI_O_DROP_IN}). Wildcard sources cannot be expressed: they are "
        "reported on stderr and left out; exit 1 then. Credentials are never "
        "written.",
    )
    cri_o.add_argument("--policy", required=True, metavar="FILE", help="policy YAML file")
    cri_o.set_defaults(run=export_crio.run_cri_o)
    return parser


def main(
    argv: Sequence[str] | None = None, *, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    args = build_parser().parse_args(argv)
    command: Command = args.run
    try:
        return command(args, out, err)
    except (ConfigError, StoreError) as error:
        print(f"mirrorgate: error: {error}", file=err)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
