"""A tiny, deterministic OCI image built in memory, so no Docker or skopeo is needed."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from dataclasses import dataclass

MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _canonical(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()


@dataclass(frozen=True)
class OciImage:
    """Manifest bytes plus every blob it references, keyed by digest."""

    manifest: bytes
    blobs: dict[str, bytes]
    media_type: str = MANIFEST_MEDIA_TYPE

    @property
    def digest(self) -> str:
        return sha256_digest(self.manifest)


def build_image(text: str = "hello from upstream\n") -> OciImage:
    """One gzip'ed tar layer holding /hello.txt; same text, same digest, every run."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        payload = text.encode()
        info = tarfile.TarInfo("hello.txt")
        # Fixed metadata: a varying mtime or owner would change the digest per run.
        info.size, info.mtime, info.mode, info.uid, info.gid = len(payload), 0, 0o644, 0, 0
        tar.addfile(info, io.BytesIO(payload))
    layer_tar = raw.getvalue()
    # gzip with mtime=0 for the same reason: the header would otherwise carry the clock.
    layer = gzip.compress(layer_tar, compresslevel=9, mtime=0)
    config = _canonical(
        {
            "architecture": "amd64",
            "os": "linux",
            "created": "1970-01-01T00:00:00Z",
            "config": {"Cmd": ["/bin/cat", "/hello.txt"]},
            "rootfs": {"type": "layers", "diff_ids": [sha256_digest(layer_tar)]},
            "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "mirrorgate e2e"}],
        }
    )
    manifest = _canonical(
        {
            "schemaVersion": 2,
            "mediaType": MANIFEST_MEDIA_TYPE,
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": sha256_digest(config),
                "size": len(config),
            },
            "layers": [
                {
                    "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                    "digest": sha256_digest(layer),
                    "size": len(layer),
                }
            ],
        }
    )
    return OciImage(
        manifest=manifest,
        blobs={sha256_digest(config): config, sha256_digest(layer): layer},
    )
