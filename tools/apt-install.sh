#!/usr/bin/env bash
# Installs Debian packages for the project's own scripts, the one way they all
# do it:
#
#   tools/apt-install.sh CALLER PACKAGE...
#
# CALLER names the script in messages. --no-install-recommends keeps the
# machine lean (callers name any Recommends they need). Package maintainer
# scripts may not start services while apt runs: docker-registry, containerd
# and podman's socket units would otherwise come up system-wide, while the
# tests run their own on ports and sockets of their choosing. Output goes to a
# log whose tail is shown only when apt fails.
set -euo pipefail
caller="$1"; shift
(($#)) || exit 0

if [[ "$(id -u)" != 0 ]]; then
  echo "$caller: $* missing and installing needs root:" >&2
  echo "  apt-get install --no-install-recommends $*" >&2
  exit 1
fi
echo "$caller: installing $* (Debian packages)" >&2
# exit 101 = "action forbidden" to invoke-rc.d, unless a policy is in place.
policy=/usr/sbin/policy-rc.d
if [[ ! -e "$policy" ]]; then
  printf '#!/bin/sh\nexit 101\n' > "$policy"
  chmod 755 "$policy"
  # Removed again even if apt fails or the script is interrupted.
  trap 'rm -f /usr/sbin/policy-rc.d' EXIT
fi
log="$(mktemp /tmp/mirrorgate-apt.XXXXXX.log)"
if ! { apt-get update -qq \
  && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@"; } \
  >"$log" 2>&1; then
  tail -n 30 "$log" >&2
  exit 1
fi
rm -f "$log"
