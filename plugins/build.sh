#!/usr/bin/env bash
# Builds mirrorgate-credential-provider, static (CGO off), for each architecture:
#
#   plugins/build.sh [OUT]     # OUT/linux-amd64/... and OUT/linux-arm64/... (default: build/plugins)
#   ARCHS="amd64" plugins/build.sh
#
# The one build of the plugin: the Makefile, image/build.sh and release/release.sh call it.
# -trimpath and no build ID, so the same source and Go version give the same bytes.
set -euo pipefail
cd "$(dirname "$0")/.."
out="$(realpath -m "${1:-build/plugins}")"
for arch in ${ARCHS:-amd64 arm64}; do
  mkdir -p "$out/linux-$arch"
  (cd plugins/credential-provider && CGO_ENABLED=0 GOOS=linux GOARCH="$arch" GOTOOLCHAIN=local \
     GOFLAGS=-mod=mod go build -trimpath -buildvcs=false -ldflags "-s -w -buildid=" \
     -o "$out/linux-$arch/mirrorgate-credential-provider" .)
done
echo "$out"
