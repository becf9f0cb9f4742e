#!/usr/bin/env bash
# Builds the real control-plane binaries the end-to-end suite runs against,
# from the Go module proxy only, and caches them by version outside the work
# tree so that only a version change triggers the 10-20 minute cold build.
#
#   tests/controlplane/build.sh            # build or reuse everything
#   tests/controlplane/build.sh etcd       # build or reuse one target
#   tests/controlplane/build.sh --print    # print the cache directory
#   tests/controlplane/build.sh --path etcd  # print one binary's cached path
#   tests/controlplane/build.sh --k8s-version  # print the Kubernetes version in use
#
# K8S_VERSION=vX.Y.Z selects another Kubernetes release for every Kubernetes
# binary (kube-apiserver, kubelet, the controllers): `make test-versions` runs
# the suite so against each minor of tests/e2e/versions.py, each cached apart.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.37.2}"
if [[ ! "$K8S_VERSION" =~ ^v1\.[0-9]+\.[0-9]+$ ]]; then
  echo "K8S_VERSION must be a release such as v1.37.2, not ${K8S_VERSION@Q}" >&2
  exit 2
fi
# The newest 3.6.x the module proxy has (v3.6.7 is not there).
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
# v5.8.3 needs go >= 1.27; v5.8.2 is the newest that builds with go 1.26 (v5.8.0
# is not on the module proxy).
KUSTOMIZE_VERSION="${KUSTOMIZE_VERSION:-v5.8.2}"
# promtool checks and unit-tests the alerting rules of manifests/overlays/monitoring.
PROMTOOL_VERSION="${PROMTOOL_VERSION:-v0.316.0}"
# The chart in manifests/helm is linted, rendered and installed with this one.
HELM_VERSION="${HELM_VERSION:-v4.3.2}"
# actionlint checks the release workflow (.github/workflows/release.yml).
ACTIONLINT_VERSION="${ACTIONLINT_VERSION:-v1.7.12}"
# kubectl, the client users run, is one version whatever K8S_VERSION is: the suite runs
# `kubectl explain` and `kubectl get` of its CRDs against every server minor it tests.
KUBECTL_VERSION="${KUBECTL_VERSION:-v1.37.2}"
# The node's runtime: the newest v2 release the module proxy serves (kind, GKE
# and EKS ship 2.x). containerd, ctr and the runc shim share this version.
CONTAINERD_VERSION="${CONTAINERD_VERSION:-v2.4.2}"
CACHE="${MIRRORGATE_CACHE:-$HOME/.cache/mirrorgate}"
BIN="$CACHE/bin"

if [[ "${1:-}" == "--print" ]]; then echo "$BIN"; exit 0; fi
if [[ "${1:-}" == "--k8s-version" ]]; then echo "$K8S_VERSION"; exit 0; fi
# `--path NAME` prints where NAME's pinned version lives, built or not: the e2e
# harness asks this script so the versions are pinned in this one file only.
if [[ "${1:-}" == "--path" ]]; then
  case "${2:-}" in
    kube-apiserver|kubelet|kube-controller-manager|kube-scheduler|kube-proxy) echo "$BIN/$2-$K8S_VERSION" ;;
    kubectl) echo "$BIN/kubectl-$KUBECTL_VERSION" ;;
    etcd) echo "$BIN/etcd-$ETCD_VERSION" ;;
    kustomize) echo "$BIN/kustomize-$KUSTOMIZE_VERSION" ;;
    promtool) echo "$BIN/promtool-$PROMTOOL_VERSION" ;;
    helm) echo "$BIN/helm-$HELM_VERSION" ;;
    actionlint) echo "$BIN/actionlint-$ACTIONLINT_VERSION" ;;
    # A directory: containerd finds its shim on PATH, so the three live together.
    containerd|ctr|containerd-shim-runc-v2) echo "$BIN/containerd-$CONTAINERD_VERSION/$2" ;;
    *) echo "unknown target ${2:-}" >&2; exit 2 ;;
  esac
  exit 0
fi

export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
mkdir -p "$BIN"

# k8s.io/kubernetes replaces its ~33 staging modules with ./staging paths,
# which `go install` refuses. A throwaway wrapper module maps each of them to
# its published v0.x twin; the list is derived from upstream's own go.mod so
# it stays right across versions.
build_kubernetes() {
  local cmd="$1" out="$BIN/$1-$K8S_VERSION"
  [[ -x "$out" ]] && return 0
  local work; work="$(mktemp -d)"
  local gomod
  gomod="$(cd "$work" && go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')"
  local staging="v0${K8S_VERSION#v1}"
  {
    echo "module mirrorgate.test/controlplane"
    echo
    echo "go 1.26.0"
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    grep -E '^\s+k8s\.io/[a-z0-9-]+ => \./staging/' "$gomod" \
      | awk -v v="$staging" '{print "replace " $1 " => " $1 " " v}'
  } > "$work/go.mod"
  echo "building $cmd $K8S_VERSION (cold build: 10-20 minutes on two cores)" >&2
  # Stamp the version as upstream's release builds do; without it /version
  # reports gitVersion "v0.0.0-master+$Format:%H$" (major/minor are right).
  # Before 1.31 /version's major and minor come from ldflags too (empty without them).
  local minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
  local ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION"
  ldflags+=" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
  ldflags+=" -X k8s.io/component-base/version.gitTreeState=clean"
  (cd "$work" && go build -trimpath -ldflags "$ldflags" -o "$out.tmp" "k8s.io/kubernetes/cmd/$cmd")
  mv "$out.tmp" "$out"
  rm -rf "$work"
}

build_module_cmd() {  # name version module-path@version package
  local name="$1" version="$2" mod="$3" pkg="$4" out="$BIN/$1-$2"
  [[ -x "$out" ]] && return 0
  local work; work="$(mktemp -d)"
  printf 'module mirrorgate.test/%s\n\ngo 1.26.0\n' "$name" > "$work/go.mod"
  echo "building $name $version" >&2
  (cd "$work" && go get "$mod@$version" && go build -trimpath -ldflags "-s -w" -o "$out.tmp" "$pkg")
  mv "$out.tmp" "$out"
  rm -rf "$work"
}

# containerd, ctr and containerd-shim-runc-v2 into one directory per version.
# Static (no cgo): the btrfs and devmapper snapshotters, which need cgo, are
# left out; the node uses overlayfs.
build_containerd() {
  local out="$BIN/containerd-$CONTAINERD_VERSION"
  [[ -x "$out/containerd-shim-runc-v2" ]] && return 0
  local work; work="$(mktemp -d)"
  printf 'module mirrorgate.test/containerd\n\ngo 1.26.0\n' > "$work/go.mod"
  echo "building containerd $CONTAINERD_VERSION (cold build: about 5 minutes on two cores)" >&2
  local mod=github.com/containerd/containerd/v2
  local ldflags="-s -w -X $mod/version.Version=$CONTAINERD_VERSION -X $mod/version.Revision=module-proxy"
  rm -rf "$out.tmp" && mkdir -p "$out.tmp"
  (cd "$work" && go get "$mod@$CONTAINERD_VERSION" \
    && go build -trimpath -tags "no_btrfs no_devmapper no_zfs" -ldflags "$ldflags" -o "$out.tmp/" \
         "$mod/cmd/containerd" "$mod/cmd/ctr" "$mod/cmd/containerd-shim-runc-v2")
  rm -rf "$out" && mv "$out.tmp" "$out"
  rm -rf "$work"
}

if (($#)); then targets=("$@"); else targets=(kube-apiserver etcd kustomize); fi
for t in "${targets[@]}"; do
  case "$t" in
    kube-apiserver|kubelet|kube-controller-manager|kube-scheduler|kube-proxy) build_kubernetes "$t" ;;
    kubectl) (K8S_VERSION="$KUBECTL_VERSION" && build_kubernetes kubectl) ;;
    etcd) build_module_cmd etcd "$ETCD_VERSION" go.etcd.io/etcd/server/v3 go.etcd.io/etcd/server/v3 ;;
    kustomize) build_module_cmd kustomize "$KUSTOMIZE_VERSION" sigs.k8s.io/kustomize/kustomize/v5 sigs.k8s.io/kustomize/kustomize/v5 ;;
    # Prometheus tags its Go module v0.3xx.y for release 3.xx.y.
    promtool) build_module_cmd promtool "$PROMTOOL_VERSION" github.com/prometheus/prometheus github.com/prometheus/prometheus/cmd/promtool ;;
    containerd) build_containerd ;;
    helm) build_module_cmd helm "$HELM_VERSION" helm.sh/helm/v4 helm.sh/helm/v4/cmd/helm ;;
    actionlint) build_module_cmd actionlint "$ACTIONLINT_VERSION" github.com/rhysd/actionlint github.com/rhysd/actionlint/cmd/actionlint ;;
    *) echo "unknown target $t" >&2; exit 2 ;;
  esac
done
