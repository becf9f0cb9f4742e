"""The CA of the kubelets' client certificates, as the API server itself trusts it.

The API server publishes its ``--client-ca-file`` in ConfigMap
``kube-system/extension-apiserver-authentication`` (key ``client-ca-file``),
readable through the bootstrap Role ``extension-apiserver-authentication-reader``:
the CA that signs every kubelet's client certificate on kubeadm, kind and most
clusters. ``serve --kubelet-client-ca`` names another file instead.
"""

from __future__ import annotations

import os
from pathlib import Path

from mirrorgate.webhook.cluster import kube
from mirrorgate.webhook.errors import ConfigError

__all__ = ["CONFIGMAP", "KEY", "NAMESPACE", "cluster_client_ca"]

NAMESPACE, CONFIGMAP, KEY = "kube-system", "extension-apiserver-authentication", "client-ca-file"


def cluster_client_ca(client: kube.Kube, directory: Path) -> str:
    """The API server's client CA written to a file in ``directory``; ConfigError says why not."""
    where = f"ConfigMap {NAMESPACE}/{CONFIGMAP}"
    try:
        found = client.get(kube.configmaps_path(NAMESPACE, CONFIGMAP))
    except kube.KubeError as error:
        raise ConfigError(
            f"cannot read the kubelets' client CA from {where}: {error}; "
            "grant the Role extension-apiserver-authentication-reader, or pass --kubelet-client-ca"
        ) from None
    pem = (found.get("data") or {}).get(KEY)
    if not isinstance(pem, str) or "BEGIN CERTIFICATE" not in pem:
        raise ConfigError(f"{where} holds no {KEY}: pass --kubelet-client-ca")
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "kubelet-client-ca.crt"
    path.write_text(pem)
    os.chmod(path, 0o644)
    return str(path)
