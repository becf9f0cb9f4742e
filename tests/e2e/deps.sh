#!/usr/bin/env bash
# Installs what the end-to-end suite runs against; idempotent, so `make test` can
# call it every time (a warm run takes well under a second):
#   * from Debian's packages, only if missing: docker-registry (distribution 2.8),
#     and for the node: runc, containernetworking-plugins (CNI
#     bridge, host-local, loopback in /usr/lib/cni), iptables (the kubelet's)
#     and iproute2 (`ip`, with which the suite removes the node's netns and links);
#     shellcheck, with which actionlint checks the release workflow's scripts;
#   * kube-apiserver, etcd, kustomize, promtool, helm, actionlint (the release
#     workflow's linter), kubectl (`kubectl explain` and `kubectl get` of the policy
#     objects), and for the node kubelet, kube-controller-manager,
#     kube-scheduler and containerd 2 (with ctr and its runc shim), built from
#     the Go module proxy by tests/controlplane/build.sh, cached by version
#     outside the work tree.
# Nothing is downloaded from anywhere else.
set -euo pipefail
cd "$(dirname "$0")/../.."

# Debian package -> a file it installs (how we tell whether it is there).
declare -A PACKAGES=(
  [docker-registry]=/usr/bin/docker-registry
  [runc]=/usr/sbin/runc
  [containernetworking-plugins]=/usr/lib/cni/bridge
  [iptables]=/usr/sbin/iptables
  [iproute2]=/bin/ip
  [shellcheck]=/usr/bin/shellcheck
)

install_packages() {
  local missing=() package
  for package in "${!PACKAGES[@]}"; do
    [[ -x "${PACKAGES[$package]}" ]] || missing+=("$package")
  done
  ((${#missing[@]})) || return 0
  bash tools/apt-install.sh deps.sh "${missing[@]}"
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
bash tests/controlplane/build.sh kube-apiserver etcd kustomize promtool helm \
  kubelet kube-controller-manager kube-scheduler containerd actionlint kubectl
