"""A tiny, deterministic OCI image built in memory, so no Docker or skopeo is needed."""

from __future__ import annotations

import functools
import gzip
import hashlib
import io
import json
import tarfile
from collections.abc import Mapping, Sequence
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


@functools.lru_cache(maxsize=8)
def _layer(files: tuple[tuple[str, tuple[bytes, int]], ...]) -> tuple[bytes, bytes]:
    """(uncompressed tar, gzip'ed tar) holding `files` ((path, (content, mode)), ...).

    Cached: images that share a binary (and differ by their config) compress it once.
    """
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path, (payload, mode) in files:
            info = tarfile.TarInfo(path)
            # Fixed metadata: a varying mtime or owner would change the digest per run.
            info.size, info.mtime, info.mode, info.uid, info.gid = len(payload), 0, mode, 0, 0
            tar.addfile(info, io.BytesIO(payload))
    layer_tar = raw.getvalue()
    # gzip with mtime=0 for the same reason: the header would otherwise carry the clock.
    return layer_tar, gzip.compress(layer_tar, compresslevel=9, mtime=0)


def build_image(
    text: str = "hello from upstream\n",
    *,
    files: Mapping[str, tuple[bytes, int]] | None = None,
    command: Sequence[str] = ("/bin/cat", "/hello.txt"),
    env: Mapping[str, str] | None = None,
) -> OciImage:
    """A one-layer image; same arguments, same digest, every run.

    By default the layer holds /hello.txt with `text`; `files` replaces it
    (e.g. a static binary, mode 0o755) and `command`/`env` go to the config,
    so images that share a binary still differ by their `env`.
    """
    if files is None:
        files = {"hello.txt": (text.encode(), 0o644)}
    layer_tar, layer = _layer(tuple(sorted(files.items())))
    image_config: dict[str, object] = {"Cmd": list(command)}
    if env:
        image_config["Env"] = [f"{key}={value}" for key, value in sorted(env.items())]
    config = _canonical(
        {
            "architecture": "amd64",
            "os": "linux",
            "created": "1970-01-01T00:00:00Z",
            "config": image_config,
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
