#!/usr/bin/env bash
# Installs what `make image` and the image tests need, from Debian's packages
# only, and only what is missing (a warm run takes well under a second):
#   * podman: builds and runs the image, daemonless, as root in this VM;
#   * mmdebstrap: builds the base image from Debian's packages, for machines
#     that cannot reach a registry of base images (see image/debian-base.sh).
set -euo pipefail

missing=()
command -v podman >/dev/null || missing+=(podman)
command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
command -v runc >/dev/null || missing+=(runc)
((${#missing[@]})) || exit 0

# runc: the OCI runtime podman is told to use (image/podman.sh says why);
# uidmap, catatonit, slirp4netns: podman's Recommends that a
# --no-install-recommends install would otherwise leave out.
bash "$(dirname "$0")/../tools/apt-install.sh" image/deps.sh "${missing[@]}" \
  uidmap catatonit slirp4netns
