#!/usr/bin/env bash
# `make release VERSION=X.Y.Z`: every release artifact, built into DIST and
# then verified (release/verify.py); nothing is published from here.
#
#   DIST/mirrorgate-X.Y.Z.oci.tar    the image, one OCI archive (an index) for PLATFORMS
#   DIST/mirrorgate-X.Y.Z.cdx.json   CycloneDX SBOM: the image's Python and Debian packages
#   DIST/mirrorgate-X.Y.Z.tgz        the Helm chart, version and appVersion X.Y.Z
#   DIST/mirrorgate-credential-provider-X.Y.Z-linux-{amd64,arm64}
#                                    the kubelet plugin, static, for both architectures
#   DIST/SHA256SUMS                  of them all
#
# VERSION must be pyproject.toml's (the one place it is set) and have its
# section in CHANGELOG.md. PLATFORMS defaults to linux/amd64 linux/arm64; a
# foreign one is built through qemu-user-static (image/emulation.sh), which
# needs root and a kernel with binfmt_misc: where either is missing the build
# stops saying so, and PLATFORMS=linux/amd64 builds the native image alone.
# The base of every image is the Debian-built one (image/debian-base.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-.venv/bin/python}"
DIST="${DIST:-dist}"
PLATFORMS="${PLATFORMS:-linux/amd64 linux/arm64}"
die() { echo "release.sh: $*" >&2; exit 2; }

version="${VERSION:-}"
[[ "$version" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "VERSION=X.Y.Z is required (got '${version}')"
project="$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)"
[[ "$version" == "$project" ]] \
  || die "VERSION $version is not pyproject.toml's $project: set it there first (the one place)"
grep -qxF "## $version" CHANGELOG.md || die "CHANGELOG.md has no section '## $version'"

native="linux/$(dpkg --print-architecture)"
[[ " $PLATFORMS " == *" $native "* ]] \
  || die "PLATFORMS must include $native: the native image is the one run and listed for the SBOM"
# DIST is emptied of an earlier release, and of nothing else.
if [[ -d "$DIST" ]] && find "$DIST" -mindepth 1 -maxdepth 1 ! -name 'mirrorgate-*' \
     ! -name SHA256SUMS | grep -q .; then
  die "$DIST holds files that are not a release's; not emptying it"
fi
mkdir -p "$DIST"
rm -f "$DIST"/mirrorgate-* "$DIST/SHA256SUMS"
image="$DIST/mirrorgate-$version.oci.tar"

# 1. The image, once per platform, into one manifest list, pushed as an OCI archive.
# podman (and mmdebstrap), from Debian's packages where missing, as image/build.sh
# installs them: the manifest list is podman's before any image is built.
bash image/deps.sh
list="localhost/mirrorgate-release:$version"
bash image/podman.sh manifest rm "$list" >/dev/null 2>&1 || true
bash image/podman.sh manifest create "$list" >/dev/null
for platform in $PLATFORMS; do
  tag="localhost/mirrorgate:$version-${platform#linux/}"
  echo "release.sh: building the $platform image ($tag)" >&2
  build=(env BASE=debian PLATFORM="$platform" TAG="$tag" VERSION="$version" bash image/build.sh)
  [[ "$platform" == "$native" ]] || build=(bash image/emulation.sh "${platform#linux/}" "${build[@]}")
  status=0
  "${build[@]}" >/dev/null || status=$?
  ((status != 3)) || die "$platform cannot be emulated here (reason above); PLATFORMS=$native builds without it"
  ((status == 0)) || exit "$status"
  bash image/podman.sh manifest add "$list" "containers-storage:$tag" >/dev/null
done
bash image/podman.sh manifest push --quiet --all --format oci "$list" \
  "oci-archive:$image:mirrorgate:$version"
bash image/podman.sh manifest rm "$list" >/dev/null

# 2. The SBOM, from what the native image has installed: its Python distributions
# (checked against the lock) and its dpkg database, with the os-release naming
# the Debian release.
listing="$("$PY" -c 'from release import sbom; print(sbom.LISTING)')"
dpkg_format="$("$PY" -c 'from release import dpkg; print(dpkg.FORMAT)')"
in_image() {
  local entrypoint="$1"; shift
  bash image/podman.sh run --rm --read-only --user 65532:65532 --network=none \
    --ulimit nofile=4096:4096 --ulimit nproc=2048:2048 --entrypoint "$entrypoint" \
    "localhost/mirrorgate:$version-${native#linux/}" "$@"
}
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
in_image dpkg-query -W -f "$dpkg_format" > "$work/dpkg"
in_image cat /etc/os-release > "$work/os-release"
in_image python3 -c "$listing" \
  | "$PY" -m release.sbom --version "$version" --debian "$work/dpkg" \
      --os-release "$work/os-release" > "$DIST/mirrorgate-$version.cdx.json"

# 3. The chart, stamped. helm is the one the e2e suite tests the chart with.
bash tests/controlplane/build.sh helm
helm="$(bash tests/controlplane/build.sh --path helm)"
"$helm" package manifests/helm/mirrorgate --version "$version" --app-version "$version" \
  --destination "$DIST" >/dev/null

# 4. The kubelet plugin, cross-compiled for both architectures (plugins/build.sh; the image
# built above carries the same build).
plugins="$(bash plugins/build.sh)"
for arch in amd64 arm64; do
  cp "$plugins/linux-$arch/mirrorgate-credential-provider" \
    "$DIST/mirrorgate-credential-provider-$version-linux-$arch"
done

# 5. The checksums, then everything checked as a user of the release would.
(cd "$DIST" && sha256sum -- *.oci.tar *.cdx.json *.tgz mirrorgate-credential-provider-* > SHA256SUMS)
# Every image is run, a foreign one through qemu as it was built.
verify=("$PY" -m release.verify --dist "$DIST" --version "$version" --platforms "$PLATFORMS"
        --helm "$helm")
for platform in $PLATFORMS; do
  [[ "$platform" == "$native" ]] || verify=(bash image/emulation.sh "${platform#linux/}" "${verify[@]}")
done
"${verify[@]}"
