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

if [[ "$(id -u)" != 0 ]]; then
  echo "image/deps.sh: ${missing[*]} missing and installing needs root:" >&2
  echo "  apt-get install --no-install-recommends ${missing[*]}" >&2
  exit 1
fi
echo "image/deps.sh: installing ${missing[*]} (Debian packages)" >&2
# Package scripts must not start services (podman ships socket units): exit
# 101 = "action forbidden" to invoke-rc.d, unless a policy is already in place.
policy=/usr/sbin/policy-rc.d
if [[ ! -e "$policy" ]]; then
  printf '#!/bin/sh\nexit 101\n' > "$policy"
  chmod 755 "$policy"
  trap 'rm -f /usr/sbin/policy-rc.d' EXIT
fi
log=/tmp/mirrorgate-image-apt.log
# runc: the OCI runtime podman is told to use (image/podman.sh says why);
# uidmap, catatonit, slirp4netns: podman's Recommends that a
# --no-install-recommends install would otherwise leave out.
if ! { apt-get update -qq \
  && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" uidmap catatonit slirp4netns; } >"$log" 2>&1; then
  tail -n 30 "$log" >&2
  exit 1
fi
