#!/usr/bin/env bash
# Installs what the end-to-end suite runs against; idempotent, so `make test` can
# call it every time (a warm run takes well under a second):
#   * from Debian's packages, only if missing: docker-registry (distribution 2.8),
#     and for the node: containerd, runc, containernetworking-plugins (CNI
#     bridge, host-local, loopback in /usr/lib/cni), iptables (the kubelet's)
#     and iproute2 (`ip`, with which the suite removes the node's netns and links);
#   * kube-apiserver, etcd, kustomize, promtool, and for the node kubelet,
#     kube-controller-manager and kube-scheduler, built from the Go module proxy
#     by tests/controlplane/build.sh, cached by version outside the work tree.
# Nothing is downloaded from anywhere else.
set -euo pipefail
cd "$(dirname "$0")/../.."

# Debian package -> a file it installs (how we tell whether it is there).
declare -A PACKAGES=(
  [docker-registry]=/usr/bin/docker-registry
  [containerd]=/usr/bin/containerd
  [runc]=/usr/sbin/runc
  [containernetworking-plugins]=/usr/lib/cni/bridge
  [iptables]=/usr/sbin/iptables
  [iproute2]=/bin/ip
)

install_packages() {
  local missing=() package
  for package in "${!PACKAGES[@]}"; do
    [[ -x "${PACKAGES[$package]}" ]] || missing+=("$package")
  done
  ((${#missing[@]})) || return 0
  if [[ "$(id -u)" != 0 ]]; then
    echo "deps.sh: ${missing[*]} missing and installing needs root:" >&2
    echo "  apt-get install --no-install-recommends ${missing[*]}" >&2
    exit 1
  fi
  echo "deps.sh: installing ${missing[*]} (Debian packages)" >&2
  # The maintainer scripts would start a system registry on :5000 and a system
  # containerd. The tests run their own, so forbid service starts while apt runs
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
        "${missing[@]}"
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
  if command -v systemctl >/dev/null && systemctl is-active --quiet containerd 2>/dev/null; then
    echo "deps.sh: stopping the system containerd the package started" >&2
    systemctl stop containerd || true
  fi
}

install_packages
bash tests/controlplane/build.sh kube-apiserver etcd kustomize promtool \
  kubelet kube-controller-manager kube-scheduler
