"""`mirrorgate credentials add|list|remove|check|migrate|generate-key`: the encrypted file
store (a v1 store rewritten as v2 by :mod:`~mirrorgate.webhook.credentials.migrate`), and
any credential resolved through its source as `serve` would (:mod:`.credentials_check`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping
from typing import Any, TextIO

from mirrorgate.webhook import policyfile
from mirrorgate.webhook.commands import EXIT_FINDINGS, EXIT_OK
from mirrorgate.webhook.credentials.store import Credential
from mirrorgate.webhook.errors import ConfigError

__all__ = [
    "add_commands",
    "run_add",
    "run_check",
    "run_generate_key",
    "run_list",
    "run_migrate",
    "run_remove",
    "store_key",
]


def store_key(args: argparse.Namespace) -> bytes:
    """The file store's key, from ``--key-file`` or ``$MIRRORGATE_STORE_KEY``."""
    import os

    from mirrorgate.webhook.credentials import filestore

    return filestore.load_key(key_file=args.key_file, environ=os.environ)


def run_add(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from mirrorgate.policy.hosts import mirror_problem
    from mirrorgate.policy.loader import CREDENTIAL_NAME_RE
    from mirrorgate.webhook.credentials import filestore

    if not CREDENTIAL_NAME_RE.fullmatch(args.name):
        raise ConfigError(
            f"credential name {args.name!r} must be lower-case letters, digits "
            "and '-' (a DNS label, at most 63 characters)"
        )
    problem = mirror_problem(args.registry)
    if problem is not None:
        raise ConfigError(f"--registry: {problem}")
    if args.from_docker_config is not None:
        from mirrorgate.webhook.credentials import dockerconfig

        username, password = dockerconfig.login_for_add(
            args.from_docker_config,
            args.registry,
            username=args.username,
            password_stdin=args.password_stdin,
        )
    else:
        if args.username is None or not args.password_stdin:
            raise ConfigError(
                "give --username and the password on standard input with "
                "--password-stdin (never as an argument: it would show in ps "
                "and shell history), or --from-docker-config FILE"
            )
        if sys.stdin.isatty():
            import getpass  # a person at a terminal: do not echo the password

            password = getpass.getpass("password: ")
        else:
            password = sys.stdin.readline().rstrip("\r\n")
        username = args.username
    if not password:
        raise ConfigError("no password on standard input")
    added = Credential(name=args.name, registry=args.registry, username=username, password=password)
    replaced = False

    def put(contents: filestore.StoreContents) -> Mapping[str, Credential]:
        nonlocal replaced
        replaced = added.name in contents.credentials
        return {**contents.credentials, added.name: added}

    # Under the store's lock: concurrent adds each keep their entry.
    filestore.update_store(args.store_file, store_key(args), put, missing_ok=True)
    print(
        f"{'updated' if replaced else 'added'} credential {args.name!r} for {args.registry} "
        f"in {args.store_file}",
        file=err,
    )
    return EXIT_OK


def run_list(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from mirrorgate.webhook.credentials import filestore

    entries = filestore.read_store(args.store_file, store_key(args)).credentials
    print(f"{'NAME':<24} {'REGISTRY':<40} USERNAME", file=out)
    for credential in sorted(entries.values(), key=lambda c: c.name):
        print(f"{credential.name:<24} {credential.registry:<40} {credential.username}", file=out)
    return EXIT_OK


def run_remove(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from mirrorgate.webhook.credentials import filestore

    found = False

    def drop(contents: filestore.StoreContents) -> Mapping[str, Credential] | None:
        nonlocal found
        found = args.name in contents.credentials
        return {n: c for n, c in contents.credentials.items() if n != args.name} if found else None

    filestore.update_store(args.store_file, store_key(args), drop)
    if not found:
        print(f"no credential {args.name!r} in {args.store_file}", file=err)
        return EXIT_FINDINGS
    print(f"removed credential {args.name!r} from {args.store_file}", file=err)
    return EXIT_OK


def run_check(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from mirrorgate.webhook.cluster import kube
    from mirrorgate.webhook.commands import credentials_check, offline

    mirror_policy = policyfile.read_policy(args.policy).policy if args.policy else None
    sources = credentials_check.Sources(
        store=args.store,
        store_file=args.store_file,
        key=lambda: store_key(args),
        kube=lambda: kube.Kube.connect(kubeconfig=args.kubeconfig, context=args.context),
        namespace=args.namespace or kube.own_namespace(),
        provider_config=args.credential_provider_config,
        provider_bin_dir=args.credential_provider_bin_dir,
        provider_socket=args.credential_provider_socket,
        provider_timeout=args.credential_provider_timeout,
    )
    try:
        image = (
            args.image
            if mirror_policy is None
            else credentials_check.admitted_image(args.name, args.image, mirror_policy)
        )
        if image != args.image:
            print(f"mirrorgate: {args.image} is admitted as {image}: checking that", file=err)
        resolved = credentials_check.check(
            args.name, image, mirror_policy=mirror_policy, sources=sources
        )
    except credentials_check.CheckFailed as error:
        print(f"mirrorgate: {error}", file=err)
        return EXIT_FINDINGS
    print(offline.dumps_json(resolved), file=out)
    return EXIT_OK


def run_migrate(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from mirrorgate.webhook.credentials import migrate

    done = migrate.migrate(args.store_file, store_key(args))
    print(
        f"{args.store_file}: v2 already, nothing to do"
        if done.kept is None
        else f"migrated {args.store_file} to v2 ({done.credentials} credentials); the v1 store "
        f"is kept at {done.kept}: delete it once the server runs on v2",
        file=err,
    )
    return EXIT_OK


def run_generate_key(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
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
    print(
        f"wrote a new store key to {args.out} (mode 0600); keep it apart from the store", file=err
    )
    return EXIT_OK


def add_commands(
    cred_commands: argparse._SubParsersAction[Any],
    *,
    store_arguments: Callable[..., None],
    source_arguments: Callable[[argparse.ArgumentParser], None],
) -> None:
    """The subcommands of ``mirrorgate credentials``; the store and source options are the
    CLI's, shared with serve's flag table."""
    add = cred_commands.add_parser(
        "add",
        help="add or replace a credential (password from stdin)",
        description="Add or replace credential NAME: a login for the mirror REGISTRY "
        "(host[:port][/path]: a path scopes the login to that part of the "
        "registry, as the kubelet matches it). The password is read from "
        "standard input, or user and password from a docker config.json "
        "(--from-docker-config).",
    )
    add.add_argument("name", metavar="NAME")
    add.add_argument(
        "--registry",
        required=True,
        metavar="HOST[:PORT][/PATH]",
        help="the mirror, or the part of it, the login is for",
    )
    add.add_argument("--username", metavar="USER")
    add.add_argument(
        "--password-stdin",
        action="store_true",
        help="read the password from standard input (required with --username)",
    )
    add.add_argument(
        "--from-docker-config",
        metavar="FILE",
        help="take REGISTRY's login from a docker config.json instead",
    )
    store_arguments(add, required=True)
    add.set_defaults(run=run_add)
    listing = cred_commands.add_parser("list", help="list credentials (never their passwords)")
    store_arguments(listing, required=True)
    listing.set_defaults(run=run_list)
    remove = cred_commands.add_parser("remove", help="remove a credential")
    remove.add_argument("name", metavar="NAME")
    store_arguments(remove, required=True)
    remove.set_defaults(run=run_remove)
    checking = cred_commands.add_parser(
        "check",
        help="resolve a credential through its source, as serve would",
        description="Resolve credential NAME for IMAGE through its source (the Kubernetes "
        "store, the file store, or its provider plugin when the policy names one) "
        "and print {credential, source, registry, username, expires} as JSON; "
        "never the password. Exit 1 when the source gives no usable login.",
    )
    checking.add_argument("name", metavar="NAME")
    checking.add_argument(
        "--image",
        required=True,
        metavar="IMAGE",
        help="an image under the mirror that uses the credential, or, "
        "with --policy, a source image: checked as the policy "
        "rewrites it",
    )
    checking.add_argument(
        "--policy", metavar="FILE", help="the policy (a credential's provider and registry scope)"
    )
    source_arguments(checking)
    checking.set_defaults(run=run_check)
    migrating = cred_commands.add_parser(
        "migrate",
        help="rewrite a v1 credential store as v2 (keeps FILE.v1)",
        description="Rewrite the v1 store FILE (as mirrorgate 0.1.0 wrote it) as a v2 store "
        "with the same key and credentials; the v1 file is kept as FILE.v1. A v2 "
        "store is left untouched.",
    )
    store_arguments(migrating, required=True)
    migrating.set_defaults(run=run_migrate)
    keygen = cred_commands.add_parser(
        "generate-key",
        help="make a new store key",
        description="Print a new random 32-byte store key (base64), or write it to FILE with "
        "mode 0600. Keep it apart from the store: a key file, or "
        "$MIRRORGATE_STORE_KEY.",
    )
    keygen.add_argument("--out", default="-", metavar="FILE")
    keygen.set_defaults(run=run_generate_key)
