"""`mirrorgate certs generate|inject`: a CA and serving certificate for the webhook Service,
and the caBundle set on its Mutating- and ValidatingWebhookConfiguration."""

from __future__ import annotations

import argparse
import pathlib
from typing import TextIO

from mirrorgate.webhook.commands import EXIT_OK
from mirrorgate.webhook.errors import ConfigError

__all__ = ["run_generate", "run_inject"]


def run_generate(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from mirrorgate import certs

    directory = pathlib.Path(args.out)
    if directory.exists() and not directory.is_dir():
        raise ConfigError(
            f"certs generate: --out {args.out} is not a directory; --out names "
            "the directory the four files are written into"
        )
    try:
        leaf = certs.generate_bundle(
            service=args.service, namespace=args.namespace, out=directory, dns=args.dns, ips=args.ip
        )
        ca_pem = (directory / certs.CA_CERT).read_bytes()
    except (ValueError, OSError) as error:
        raise ConfigError(f"certs generate: {error}") from None
    for name, note in (
        (certs.CA_CERT, ""),
        (certs.CA_KEY, " (signs certificates: keep it out of the webhook Pod)"),
        (certs.TLS_CERT, ""),
        (certs.TLS_KEY, ""),
    ):
        print(f"wrote {directory / name}{note}", file=err)
    print(f"serving certificate valid until {leaf.not_valid_after:%Y-%m-%d %H:%M} UTC", file=err)
    print(f"caBundle: {certs.ca_bundle_b64(ca_pem)}", file=out)
    return EXIT_OK


def run_inject(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from mirrorgate import certs
    from mirrorgate.webhook.cluster import cabundle, kube

    try:
        ca_pem = pathlib.Path(args.ca).read_bytes()
        bundle = certs.ca_bundle_b64(ca_pem)
    except OSError as error:
        raise ConfigError(f"{args.ca}: cannot read: {error.strerror}") from None
    except ValueError as error:
        raise ConfigError(f"{args.ca}: {error}") from None
    try:
        client = kube.Kube.connect(kubeconfig=args.kubeconfig, context=args.context)
        for kind, path_of in cabundle.KINDS.items():
            path = path_of(args.webhook_config)
            try:
                configuration = client.get(path)
            except kube.NotFound:
                if kind == "MutatingWebhookConfiguration":
                    raise
                # An install from before the policy webhook moved has no validating one.
                print(f"no {kind} {args.webhook_config}: left alone", file=err)
                continue
            webhooks = configuration.get("webhooks") or []
            for webhook in webhooks:
                webhook.setdefault("clientConfig", {})["caBundle"] = bundle
            client.replace(path, configuration)  # carries resourceVersion: no lost update
            print(
                f"set caBundle on {len(webhooks)} webhook{'s' if len(webhooks) != 1 else ''} of "
                f"{kind} {args.webhook_config}",
                file=err,
            )
    except kube.KubeError as error:
        raise ConfigError(f"certs inject: {error}") from None
    return EXIT_OK
