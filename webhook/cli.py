"""The `mirrorgate` command line.

Exit codes, for every command: 0 fine, 1 findings (warnings, invalid images,
an invalid policy under `policy check`), 2 usage or configuration error with
a one-line message naming what is wrong. Never a traceback. `serve` exits 0
after SIGTERM (once the requests in flight are answered), 130 after Ctrl-C,
and 2 when its port is busy.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
from collections.abc import Callable, Sequence
from typing import Any, TextIO

import yaml

from mirrorgate import policy
from mirrorgate.webhook import policyfile
from mirrorgate.webhook.commands import offline
from mirrorgate.webhook.credentials.store import StoreError
from mirrorgate.webhook.edge.limits import Limits
from mirrorgate.webhook.policyfile import ConfigError
from mirrorgate.webhook.version import VERSION

__all__ = ["main"]

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE = 0, 1, 2

Command = Callable[[argparse.Namespace, TextIO, TextIO], int]


def _read_input(path: str, stdin: TextIO) -> tuple[str, str]:
    if path == "-":
        return stdin.read(), "<stdin>"
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read(), path
    except OSError as error:
        raise ConfigError(f"{path}: cannot read: {error.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None


def _mode_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mode", choices=offline.MODES, default=offline.ENFORCE,
                        help="the namespace's mirrorgate.io/mode label; audit also when the "
                             "server runs --audit-only (default: %(default)s)")


def cmd_rewrite(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    rules = policyfile.read_policy(args.policy).policy
    text, source = _read_input(args.filename, sys.stdin)
    documents = offline.load_documents(text, source=source)
    try:
        outputs, patches, warnings = offline.rewrite_documents(
            documents, rules=rules, namespace=args.namespace, mode=args.mode)
    except offline.NothingToRewrite as error:
        raise ConfigError(f"{source}: {error}") from None
    for warning in warnings:
        print(f"warning: {warning}", file=err)
    if args.output == "patch":
        for ops in patches:
            print(offline.dumps_json(ops), file=out)
    elif args.output == "json":
        value = outputs[0] if len(outputs) == 1 else {
            "apiVersion": "v1", "kind": "List", "items": outputs}
        print(json.dumps(value, indent=2), file=out)
    else:
        yaml.safe_dump_all(outputs, out, sort_keys=False)
    return EXIT_FINDINGS if warnings else EXIT_OK


def _label(text: str) -> tuple[str, str]:
    key, equals, value = text.partition("=")
    if not key or not equals:
        raise ConfigError(f"--label {text!r}: write KEY=VALUE")
    return key, value


def cmd_explain(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    rules = policyfile.read_policy(args.policy).policy if args.policy else None
    labels = dict(_label(text) for text in args.label)
    status = EXIT_OK
    for image in args.images:
        explained = offline.explain_image(image, rules=rules, namespace=args.namespace,
                                          labels=labels, mode=args.mode)
        if not explained["valid"] or explained["warning"] is not None:
            status = EXIT_FINDINGS
        print(offline.dumps_json(explained), file=out)
    return status


def cmd_policy_check(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    try:
        data = pathlib.Path(args.file).read_bytes()
    except OSError as error:
        raise ConfigError(f"{args.file}: cannot read policy: {error.strerror}") from None
    try:
        loaded = policyfile.read_policy(args.file, data=data)
    except ConfigError as error:
        # Here an invalid policy is the finding, not a usage error.
        print(error, file=out)
        return EXIT_FINDINGS
    rules = loaded.policy
    print(f"{args.file}: valid (version {loaded.version}, "
          f"{len(rules.rules)} mirror rule{'s' if len(rules.rules) != 1 else ''}, "
          f"{len(rules.grants)} credential grant{'s' if len(rules.grants) != 1 else ''})",
          file=out)
    for advice in policy.advice(rules):
        print(f"  warning: {advice}", file=out)
    if args.store_file is None:
        return EXIT_OK
    from mirrorgate.webhook.credentials import filestore
    from mirrorgate.webhook.health import monitor

    problems = monitor.credential_problems(
        rules, filestore.read_store(args.store_file, _store_key(args)).credentials)
    for name, why in sorted(problems.items()):
        # The same words the server logs and lists in /readyz.
        print(f"  credential {name}: {why} ({args.store_file})", file=out)
    return EXIT_FINDINGS if problems else EXIT_OK


def cmd_serve(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from mirrorgate.webhook.commands import serve  # uvicorn and the app load only for this command

    serve.serve(serve.Settings(
        policy=args.policy, tls_cert=args.tls_cert, tls_key=args.tls_key, host=args.host,
        port=args.port, reload_interval=args.reload_interval, log_level=args.log_level,
        kubeconfig=args.kubeconfig, kube_context=args.context, namespace=args.namespace,
        store=args.store, store_file=args.store_file, store_key_file=args.key_file,
        credential_deadline=args.credential_deadline, audit_only=args.audit_only,
        reconcile_interval=args.reconcile_interval,
        credential_provider_config=args.credential_provider_config,
        credential_provider_bin_dir=args.credential_provider_bin_dir,
        credential_provider_timeout=args.credential_provider_timeout,
        tls_secret=args.tls_secret, service=args.service,
        webhook_configuration=args.webhook_config, cert_check_interval=args.cert_check_interval,
        tls_dir=args.tls_dir, tls_names=tuple(args.tls_name), limits=Limits(
            max_connections=args.max_connections, max_header_bytes=args.max_header_bytes,
            max_headers=args.max_headers, header_timeout=args.header_timeout,
            body_timeout=args.body_timeout, idle_timeout=args.idle_timeout,
            max_buffered_bytes=args.max_buffered_bytes),
        health_probes=args.health_probes))
    return EXIT_OK


def _store_key(args: argparse.Namespace) -> bytes:
    import os

    from mirrorgate.webhook.credentials import filestore

    return filestore.load_key(key_file=args.key_file, environ=os.environ)


def cmd_credentials_add(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from mirrorgate.policy.model import CREDENTIAL_NAME_RE, mirror_problem
    from mirrorgate.webhook.credentials import filestore
    from mirrorgate.webhook.credentials.store import Credential

    if not CREDENTIAL_NAME_RE.fullmatch(args.name):
        raise ConfigError(f"credential name {args.name!r} must be lower-case letters, digits "
                          "and '-' (a DNS label, at most 63 characters)")
    problem = mirror_problem(args.registry)
    if problem is not None:
        raise ConfigError(f"--registry: {problem}")
    if not args.password_stdin:
        raise ConfigError("pass the password on standard input with --password-stdin "
                          "(never as an argument: it would show in ps and shell history)")
    if sys.stdin.isatty():
        import getpass  # a person at a terminal: do not echo the password

        password = getpass.getpass("password: ")
    else:
        password = sys.stdin.readline().rstrip("\r\n")
    if not password:
        raise ConfigError("no password on standard input")
    key = _store_key(args)
    contents = filestore.read_store(args.store_file, key, missing_ok=True)
    replaced = args.name in contents.credentials
    entries = {**contents.credentials, args.name: Credential(
        name=args.name, registry=args.registry, username=args.username, password=password)}
    filestore.write_store(args.store_file, key, contents.replaced(entries))
    print(f"{'updated' if replaced else 'added'} credential {args.name!r} for {args.registry} "
          f"in {args.store_file}", file=err)
    return EXIT_OK


def cmd_credentials_list(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from mirrorgate.webhook.credentials import filestore

    entries = filestore.read_store(args.store_file, _store_key(args)).credentials
    print(f"{'NAME':<24} {'REGISTRY':<40} USERNAME", file=out)
    for credential in sorted(entries.values(), key=lambda c: c.name):
        print(f"{credential.name:<24} {credential.registry:<40} {credential.username}", file=out)
    return EXIT_OK


def cmd_credentials_remove(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from mirrorgate.webhook.credentials import filestore

    key = _store_key(args)
    contents = filestore.read_store(args.store_file, key)
    if args.name not in contents.credentials:
        print(f"no credential {args.name!r} in {args.store_file}", file=err)
        return EXIT_FINDINGS
    entries = {n: c for n, c in contents.credentials.items() if n != args.name}
    filestore.write_store(args.store_file, key, contents.replaced(entries))
    print(f"removed credential {args.name!r} from {args.store_file}", file=err)
    return EXIT_OK


def cmd_credentials_check(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from mirrorgate.webhook.cluster import kube
    from mirrorgate.webhook.commands import credentials_check

    rules = policyfile.read_policy(args.policy).policy if args.policy else None
    sources = credentials_check.Sources(
        store=args.store, store_file=args.store_file, key=lambda: _store_key(args),
        kube=lambda: kube.Kube.connect(kubeconfig=args.kubeconfig, context=args.context),
        namespace=args.namespace or kube.own_namespace(),
        provider_config=args.credential_provider_config,
        provider_bin_dir=args.credential_provider_bin_dir,
        provider_timeout=args.credential_provider_timeout)
    try:
        resolved = credentials_check.check(args.name, args.image, rules=rules, sources=sources)
    except credentials_check.CheckFailed as error:
        print(f"mirrorgate: {error}", file=err)
        return EXIT_FINDINGS
    print(offline.dumps_json(resolved), file=out)
    return EXIT_OK


def cmd_credentials_generate_key(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    import os

    from mirrorgate.webhook.credentials import filestore

    key = filestore.generate_key()
    if args.out == "-":
        print(key, file=out)
        return EXIT_OK
    try:
        fd = os.open(args.out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise ConfigError(f"{args.out}: already exists; not overwriting a key") from None
    except OSError as error:
        raise ConfigError(f"{args.out}: {error.strerror}") from None
    with os.fdopen(fd, "w") as handle:
        handle.write(key + "\n")
    print(f"wrote a new store key to {args.out} (mode 0600); keep it apart from the store",
          file=err)
    return EXIT_OK


def cmd_certs_generate(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from mirrorgate import certs
    directory = pathlib.Path(args.out)
    if directory.exists() and not directory.is_dir():
        raise ConfigError(f"certs generate: --out {args.out} is not a directory; --out names "
                          "the directory the four files are written into")
    try:
        leaf = certs.generate_bundle(service=args.service, namespace=args.namespace,
                                     out=directory, dns=args.dns, ips=args.ip)
        ca_pem = (directory / certs.CA_CERT).read_bytes()
    except (ValueError, OSError) as error:
        raise ConfigError(f"certs generate: {error}") from None
    for name, note in ((certs.CA_CERT, ""),
                       (certs.CA_KEY, " (signs certificates: keep it out of the webhook Pod)"),
                       (certs.TLS_CERT, ""), (certs.TLS_KEY, "")):
        print(f"wrote {directory / name}{note}", file=err)
    print(f"serving certificate valid until {leaf.not_valid_after:%Y-%m-%d %H:%M} UTC",
          file=err)
    print(f"caBundle: {certs.ca_bundle_b64(ca_pem)}", file=out)
    return EXIT_OK


def cmd_certs_inject(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from mirrorgate import certs
    from mirrorgate.webhook.cluster import kube

    try:
        ca_pem = pathlib.Path(args.ca).read_bytes()
        bundle = certs.ca_bundle_b64(ca_pem)
    except OSError as error:
        raise ConfigError(f"{args.ca}: cannot read: {error.strerror}") from None
    except ValueError as error:
        raise ConfigError(f"{args.ca}: {error}") from None
    try:
        client = kube.Kube.connect(kubeconfig=args.kubeconfig, context=args.context)
        path = kube.webhook_configuration_path(args.webhook_config)
        configuration = client.get(path)
        webhooks = configuration.get("webhooks") or []
        for webhook in webhooks:
            webhook.setdefault("clientConfig", {})["caBundle"] = bundle
        client.replace(path, configuration)  # carries resourceVersion: no lost update
    except kube.KubeError as error:
        raise ConfigError(f"certs inject: {error}") from None
    print(f"set caBundle on {len(webhooks)} webhook{'s' if len(webhooks) != 1 else ''} of "
          f"MutatingWebhookConfiguration {args.webhook_config}", file=err)
    return EXIT_OK


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (exit 2) that name the command."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _group(commands: argparse._SubParsersAction[Any], name: str,
           text: str) -> argparse._SubParsersAction[Any]:
    """A command that only groups subcommands (`mirrorgate policy check`, ...)."""
    group = commands.add_parser(name, help=text)
    subcommands: argparse._SubParsersAction[Any] = group.add_subparsers(
        dest=f"{name}_command", metavar="COMMAND", parser_class=_Parser)
    subcommands.required = True
    return subcommands


def _store_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup, *,
                     flag: str = "--store", required: bool = False,
                     text: str = "the encrypted credential store file") -> None:
    # `credentials` and `policy check` say --store; `serve` uses --store for the kind of store.
    parser.add_argument(flag, dest="store_file", required=required, metavar="FILE", help=text)
    parser.add_argument("--key-file", metavar="FILE",
                        help="file holding the store key (default: $MIRRORGATE_STORE_KEY)")


def _source_arguments(group: argparse._ArgumentGroup | argparse.ArgumentParser, *,
                      stores: tuple[str, ...]) -> None:
    """Where credentials come from: the same options for `serve` and `credentials check`."""
    group.add_argument("--kubeconfig", metavar="FILE",
                       help="kubeconfig for the cluster (default: the in-cluster service "
                            "account when in a Pod, else standalone: no pull secrets)")
    group.add_argument("--context", help="kubeconfig context")
    group.add_argument("--namespace", help="mirrorgate's own namespace (credential Secrets, "
                       "the Lease; default: the Pod's namespace, else 'mirrorgate')")
    group.add_argument("--store", choices=stores,
                       help="credential store (default: kubernetes with a cluster, file "
                            "with --store-file, else none)")
    _store_arguments(group, flag="--store-file")
    group.add_argument("--credential-provider-config", metavar="FILE",
                       help="the kubelet's CredentialProviderConfig, for policy credentials "
                            "with a provider")
    group.add_argument("--credential-provider-bin-dir", metavar="DIR",
                       help="where the credential-provider plugins are")
    group.add_argument("--credential-provider-timeout", type=float, default=10.0,
                       metavar="SECONDS", help="a plugin running longer is killed "
                                               "(default: %(default)s)")


def _limit_arguments(group: argparse._ArgumentGroup) -> None:
    defaults = Limits()
    for flag, kind, metavar, text in (
            ("--max-connections", int, "N", "open connections, TLS handshakes included; over "
             "it, the least recently active connection not being answered is closed"),
            ("--max-header-bytes", int, "BYTES", "request line and header fields (431 beyond)"),
            ("--max-headers", int, "N", "header fields per request (431 beyond)"),
            ("--header-timeout", float, "SECONDS", "from accept (TLS handshake included), or "
             "from a request's first byte, to the end of its head"),
            ("--body-timeout", float, "SECONDS", "from the end of a request's head to the end "
             "of its body"),
            ("--idle-timeout", float, "SECONDS", "how long a keep-alive connection may wait "
             "for its next request"),
            ("--max-buffered-bytes", int, "BYTES", "request-body bytes held at once across all "
             "connections; over it, the longest-running body reads are closed")):
        dest = flag[2:].replace("-", "_")
        group.add_argument(flag, type=kind, default=getattr(defaults, dest), metavar=metavar,
                           help=f"{text} (default: %(default)s)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="mirrorgate", description=(
        "Rewrite Pod images to authenticated registry mirrors at admission, "
        "with matching pull secrets."))
    parser.add_argument("--version", action="version", version=f"mirrorgate {VERSION}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True

    rewrite = commands.add_parser(
        "rewrite", help="print Pods, and workloads' Pods, as mirrorgate would admit them "
                        "(offline)",
        description="Print each Pod as it would be admitted (or its JSON Patch); warnings go "
                    "to stderr. A workload (Deployment, StatefulSet, DaemonSet, ReplicaSet, "
                    "ReplicationController, Job, CronJob, PodTemplate) comes out as the Pod "
                    "its controller would create, as admitted: templates themselves are never "
                    "mutated. Other objects are passed over. With --mode audit Pods come out "
                    "unchanged and every planned rewrite is a warning. Exit 1 when there are "
                    "warnings, 2 when the input has no Pod and no workload.")
    rewrite.add_argument("--policy", required=True, metavar="FILE", help="policy YAML file")
    rewrite.add_argument("-n", "--namespace", help="namespace to plan for "
                         "(default: the Pod's own, else 'default')")
    _mode_argument(rewrite)
    rewrite.add_argument("-o", "--output", choices=("yaml", "json", "patch"), default="yaml")
    rewrite.add_argument("-f", "--filename", default="-", metavar="FILE",
                         help="Pod manifests, YAML or JSON ('-' for stdin, the default)")
    rewrite.set_defaults(run=cmd_rewrite)

    explain = commands.add_parser(
        "explain", help="explain what mirrorgate makes of image references",
        description="Print one JSON object per image, in order: what admission would do with "
                    "it in a Pod of the namespace. `outcome` is one of excluded, skipped, "
                    "invalid, no-rule, already-mirrored, not-granted, rewrite (null without "
                    "--policy). Exit 1 when an image is invalid or admission would warn "
                    "about it.")
    explain.add_argument("--policy", metavar="FILE", help="policy YAML file (optional)")
    explain.add_argument("-n", "--namespace", default=offline.DEFAULT_NAMESPACE,
                         help="the Pod's namespace (default: %(default)s)")
    explain.add_argument("-l", "--label", action="append", default=[], metavar="KEY=VALUE",
                         help="a label of the Pod, e.g. mirrorgate.io/skip=true (repeatable)")
    _mode_argument(explain)
    explain.add_argument("images", nargs="+", metavar="IMAGE")
    explain.set_defaults(run=cmd_explain)

    policy_commands = _group(commands, "policy", "work with policy files")
    check = policy_commands.add_parser(
        "check", help="validate a policy file",
        description="Validate a policy file and list every error with its field path. "
                    "Exit 1 when it is invalid, or when --store is given and a credential the "
                    "policy uses is missing from it or is for another host than its mirror.")
    check.add_argument("file", metavar="FILE")
    _store_arguments(check, text="also check the policy's credentials against this "
                                 "encrypted credential store (offline)")
    check.set_defaults(run=cmd_policy_check)

    serve = commands.add_parser(
        "serve", help="run the HTTPS admission webhook",
        description="Serve /mutate (enforce), /audit (dry-run audit), /healthz, /readyz and "
                    "/metrics over HTTPS. The policy and certificate files are reloaded when "
                    "they change.")
    admission = serve.add_argument_group("admission")
    admission.add_argument("--policy", required=True, metavar="FILE",
                           help="the policy YAML, reloaded when it changes")
    admission.add_argument("--audit-only", action="store_true",
                           help="every endpoint only reports, whatever the namespace labels: "
                                "a cluster-wide report-only override (a safe first install)")
    admission.add_argument("--host", default="127.0.0.1",
                           help="listen address (default: %(default)s)")
    admission.add_argument("--port", type=int, default=8443, help="(default: %(default)s)")
    admission.add_argument("--reload-interval", type=float, default=1.0, metavar="SECONDS",
                           help="how often to check the policy, certificate and store files "
                                "(default: %(default)s)")
    admission.add_argument("--log-level", default="info",
                           choices=("debug", "info", "warning", "error"))
    admission.add_argument("--no-health-probes", dest="health_probes", action="store_false",
                           help="do not probe mirrors and credential logins (every mirror "
                                "counts as up); the store is still checked against the policy")

    tls = serve.add_argument_group(
        "certificates", "either files (--tls-cert, --tls-key) or a Secret (--tls-secret)")
    tls.add_argument("--tls-cert", metavar="FILE", help="serving certificate (PEM)")
    tls.add_argument("--tls-key", metavar="FILE", help="its private key (PEM)")
    tls.add_argument("--tls-secret", metavar="NAME",
                     help="keep a CA and serving certificate in this Secret of mirrorgate's "
                          "namespace, created and renewed as needed")
    tls.add_argument("--service", default="mirrorgate", metavar="NAME",
                     help="with --tls-secret: the Service the certificate is for "
                          "(default: %(default)s)")
    tls.add_argument("--webhook-config", metavar="NAME",
                     help="with --tls-secret: keep this MutatingWebhookConfiguration's "
                          "caBundle in step with the CA")
    tls.add_argument("--tls-name", action="append", default=[], metavar="NAME",
                     help="with --tls-secret: an extra DNS name or IP for the serving "
                          "certificate (repeatable)")
    tls.add_argument("--tls-dir", metavar="DIR",
                     help="with --tls-secret: where the serving files are written "
                          "(default: a temporary folder)")
    tls.add_argument("--cert-check-interval", type=float, default=300.0, metavar="SECONDS",
                     help="with --tls-secret: how often the certificates are checked "
                          "(default: %(default)s)")

    cluster = serve.add_argument_group("cluster and credentials")
    _source_arguments(cluster, stores=("kubernetes", "file", "none"))
    cluster.add_argument("--credential-deadline", type=float, default=2.0, metavar="SECONDS",
                         help="longest time admission spends making pull secrets "
                              "(default: %(default)s)")
    cluster.add_argument("--reconcile-interval", type=float, default=30.0, metavar="SECONDS",
                         help="how often the leader re-asserts every generated pull secret, "
                              "bringing back deleted ones (default: %(default)s)")
    _limit_arguments(serve.add_argument_group(
        "limits", "what any client may make the server hold (see the README's Security section)"))
    serve.set_defaults(run=cmd_serve)

    cred_commands = _group(commands, "credentials",
                           "the encrypted file credential store; check any credential")
    add = cred_commands.add_parser(
        "add", help="add or replace a credential (password from stdin)",
        description="Add or replace credential NAME: a login for the mirror REGISTRY "
                    "(host[:port]). The password is read from standard input.")
    add.add_argument("name", metavar="NAME")
    add.add_argument("--registry", required=True, metavar="HOST")
    add.add_argument("--username", required=True, metavar="USER")
    add.add_argument("--password-stdin", action="store_true",
                     help="read the password from standard input (required)")
    _store_arguments(add, required=True)
    add.set_defaults(run=cmd_credentials_add)
    listing = cred_commands.add_parser("list", help="list credentials (never their passwords)")
    _store_arguments(listing, required=True)
    listing.set_defaults(run=cmd_credentials_list)
    remove = cred_commands.add_parser("remove", help="remove a credential")
    remove.add_argument("name", metavar="NAME")
    _store_arguments(remove, required=True)
    remove.set_defaults(run=cmd_credentials_remove)
    checking = cred_commands.add_parser(
        "check", help="resolve a credential through its source, as serve would",
        description="Resolve credential NAME for IMAGE through its source (the Kubernetes "
                    "store, the file store, or its provider plugin when the policy names one) "
                    "and print {credential, source, registry, username, expires} as JSON; "
                    "never the password. Exit 1 when the source gives no usable login.")
    checking.add_argument("name", metavar="NAME")
    checking.add_argument("--image", required=True, metavar="IMAGE",
                          help="an image under the mirror that uses the credential")
    checking.add_argument("--policy", metavar="FILE",
                          help="the policy (a credential's provider and registry scope)")
    _source_arguments(checking, stores=("kubernetes", "file"))
    checking.set_defaults(run=cmd_credentials_check)
    keygen = cred_commands.add_parser(
        "generate-key", help="make a new store key",
        description="Print a new random 32-byte store key (base64), or write it to FILE with "
                    "mode 0600. Keep it apart from the store: a key file, or "
                    "$MIRRORGATE_STORE_KEY.")
    keygen.add_argument("--out", default="-", metavar="FILE")
    keygen.set_defaults(run=cmd_credentials_generate_key)

    certs_commands = _group(commands, "certs", "CA and serving certificates")
    generate = certs_commands.add_parser(
        "generate", help="write a CA and a serving certificate for the webhook Service",
        description="Write ca.crt, ca.key, tls.crt and tls.key into DIR (keys 0600, replaced "
                    "atomically) and print the caBundle. An existing valid CA in DIR is "
                    "reused, so the caBundle stays the same.")
    generate.add_argument("--service", required=True, metavar="NAME")
    generate.add_argument("--namespace", required=True, metavar="NS")
    generate.add_argument("--out", required=True, metavar="DIR")
    generate.add_argument("--dns", action="append", default=[], metavar="NAME",
                          help="extra DNS name (repeatable)")
    generate.add_argument("--ip", action="append", default=[], metavar="IP",
                          help="extra IP address (repeatable)")
    generate.set_defaults(run=cmd_certs_generate)
    inject = certs_commands.add_parser(
        "inject", help="set caBundle on a MutatingWebhookConfiguration",
        description="Set caBundle (base64 of the CA PEM, exactly once) on every webhook of "
                    "the MutatingWebhookConfiguration NAME.")
    inject.add_argument("--webhook-config", required=True, metavar="NAME")
    inject.add_argument("--ca", required=True, metavar="FILE", help="CA certificate (PEM)")
    inject.add_argument("--kubeconfig", metavar="FILE")
    inject.add_argument("--context")
    inject.set_defaults(run=cmd_certs_inject)
    from mirrorgate.webhook.commands import audit, export  # commands kept in their own modules

    audit.add_parser(commands, _Parser)
    export.add_parser(commands, _Parser)
    return parser


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None,
         err: TextIO | None = None) -> int:
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
