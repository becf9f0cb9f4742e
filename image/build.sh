#!/usr/bin/env bash
# Builds the mirrorgate image with podman (installed from Debian's packages by
# image/deps.sh when missing) and prints its name.
#
#   image/build.sh                  # base from Debian's packages (image/debian-base.sh)
#   BASE=official PYTHON_IMAGE=docker.io/library/python:3.11-slim-bookworm@sha256:... image/build.sh
#                                   # the official Python base, by a digest you verified
#   TAG=registry.example/mirrorgate:0.1.0 image/build.sh
#   PLATFORM=linux/arm64 image/build.sh   # another architecture, emulated (image/emulation.sh)
#
# The layer cache makes a rebuild after a source change take seconds: the
# locked dependencies sit in a layer of their own.
set -euo pipefail
cd "$(dirname "$0")/.."

bash image/deps.sh
# The kubelet plugin for both architectures, cross-compiled with the host's Go (CGO off):
# each platform's image carries its own at /opt/mirrorgate/libexec/mirrorgate-credential-provider.
bash plugins/build.sh build/plugins >/dev/null
# VERSION labels the image (org.opencontainers.image.version); pyproject.toml's by default.
version="${VERSION:-$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)}"
TAG="${TAG:-localhost/mirrorgate:$version}"

args=(--network=host --layers --tag "$TAG" --file Containerfile --build-arg "VERSION=$version")
if [[ -n "${PLATFORM:-}" ]]; then
  args+=(--platform "$PLATFORM")
fi
case "${BASE:-debian}" in
  debian)
    arch="${PLATFORM:-}"; arch="${arch#linux/}"
    args+=(--build-arg "PYTHON_IMAGE=$(ARCH="${arch:-}" bash image/debian-base.sh)") ;;
  official)
    # The official image only by a digest its user resolved and checked: the
    # project ships none it could not verify (docs/install.md, "1. The image").
    if [[ "${PYTHON_IMAGE:-}" != *@sha256:* ]]; then
      echo "image/build.sh: BASE=official needs PYTHON_IMAGE=<image>@sha256:<digest>, a digest" \
           "you resolved and verified" >&2
      exit 2
    fi
    args+=(--build-arg "PYTHON_IMAGE=$PYTHON_IMAGE") ;;
  *) echo "image/build.sh: BASE must be debian or official, not ${BASE}" >&2; exit 2 ;;
esac

# pip inside the build reaches the index the way pip on this machine does: its
# index URL and CA bundle (a TLS-intercepting proxy, a corporate index) are
# passed through, the bundle mounted read-only for the build's RUN steps only.
index="${PIP_INDEX_URL:-$(python3 -m pip config get global.index-url 2>/dev/null || true)}"
cert="${PIP_CERT:-$(python3 -m pip config get global.cert 2>/dev/null || true)}"
[[ -n "$index" ]] && args+=(--build-arg "PIP_INDEX_URL=$index")
if [[ -n "$cert" ]]; then
  args+=(--volume "$(readlink -f "$cert"):/run/mirrorgate-build/pip-ca.crt:ro"
         --build-arg PIP_CERT=/run/mirrorgate-build/pip-ca.crt)
fi

log="$(mktemp)"
trap 'rm -f "$log"' EXIT
if ! bash image/podman.sh build "${args[@]}" . >"$log" 2>&1; then
  tail -n 40 "$log" >&2
  echo "image/build.sh: podman build failed (whole log above the last 40 lines in $log)" >&2
  trap - EXIT
  exit 1
fi
echo "$TAG"
