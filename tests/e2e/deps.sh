#!/usr/bin/env bash
# Installs what the end-to-end suite runs against; idempotent, so `make test` can
# call it every time (a warm run takes well under a second):
#   * docker-registry (distribution 2.8) from Debian's packages, only if missing;
#   * kube-apiserver, etcd, kustomize and promtool built from the Go module proxy by
#     tests/controlplane/build.sh, cached by version outside the work tree.
# Nothing is downloaded from anywhere else.
set -euo pipefail
cd "$(dirname "$0")/../.."

install_registry() {
  command -v docker-registry >/dev/null && return 0
  if [[ "$(id -u)" != 0 ]]; then
    echo "deps.sh: docker-registry is missing and installing it needs root:" >&2
    echo "  apt-get install --no-install-recommends docker-registry" >&2
    exit 1
  fi
  echo "deps.sh: installing docker-registry (Debian package)" >&2
  # The package's maintainer script would start a system registry on :5000. The
  # tests run their own on free ports, so forbid service starts while apt runs
  # (exit 101 = "action forbidden" to invoke-rc.d), unless a policy is in place.
  local policy=/usr/sbin/policy-rc.d
  if [[ ! -e "$policy" ]]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy"
    chmod 755 "$policy"
    # Removed again even if apt fails or the script is interrupted.
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  local rc=0
  {
    apt-get update -qq \
      && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        docker-registry
  } >/tmp/mirrorgate-apt.log 2>&1 || rc=$?
  if [[ "$(trap -p EXIT)" ]]; then rm -f "$policy"; trap - EXIT; fi
  if ((rc != 0)); then
    tail -n 30 /tmp/mirrorgate-apt.log >&2
    exit "$rc"
  fi
  # Belt and braces: should a system instance have started anyway (a machine
  # with a real init), stop it through its own init script.
  if [[ -s /var/run/docker-registry.pid ]] \
    && kill -0 "$(cat /var/run/docker-registry.pid)" 2>/dev/null; then
    echo "deps.sh: stopping the system docker-registry the package started" >&2
    /etc/init.d/docker-registry stop >/dev/null 2>&1 || true
  fi
}

install_registry
bash tests/controlplane/build.sh kube-apiserver etcd kustomize promtool
