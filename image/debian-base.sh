#!/usr/bin/env bash
# Builds a Python base image from Debian's packages with mmdebstrap, for
# machines that reach no registry of base images (this one, its CI). The
# packages come from this machine's own apt sources, so no mirror is named
# here. Prints the image's name; reuses it when the script and the sources
# have not changed (the name carries their hash).
#
#   image/debian-base.sh            # build or reuse; prints localhost/mirrorgate-base:bookworm-<hash>
#   ARCH=arm64 image/debian-base.sh # another architecture (foreign ones run through qemu:
#                                   # image/emulation.sh); prints ...:bookworm-arm64-<hash>
#
# This is the project's default base (see the Containerfile): every package
# comes from the Debian archive through apt's signature checks (the Release
# files are verified against the keyring of the sources' Signed-By), so the
# base is verified here, on the machine that builds it.
set -euo pipefail
self="$(readlink -f "$0")"
native="$(dpkg --print-architecture)"
ARCH="${ARCH:-$native}"

SUITE=bookworm   # Debian 12: Python 3.11, the version the project supports and the official base carries
# python3-venv: the build stage makes the virtualenv with ensurepip, as on the
# official base. ca-certificates: Debian's CA store (/etc/ssl/certs/ca-certificates.crt,
# Python's and Go's default), without which no mirror with a public CA's
# certificate (Let's Encrypt, a SaaS registry, a cloud's API for a credential
# plugin) could be verified; named, not left to python3-venv's pip wheel that
# depends on it; the official base carries it too. Nothing else: no apt, no shell
# beyond the Essential set.
PACKAGES=python3,python3-venv,ca-certificates

sources=()
for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
  [[ -s "$f" ]] && sources+=("$f")
done
((${#sources[@]})) || { echo "debian-base.sh: no apt sources on this machine" >&2; exit 2; }

key="$(cat "$self" "${sources[@]}" | sha256sum | cut -c1-12)"
name="localhost/mirrorgate-base:$SUITE-$key"
[[ "$ARCH" == "$native" ]] || name="localhost/mirrorgate-base:$SUITE-$ARCH-$key"
if bash "$(dirname "$self")/podman.sh" image exists "$name"; then echo "$name"; exit 0; fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
echo "debian-base.sh: building $name with mmdebstrap (about a minute natively, several under emulation)" >&2
# Only the sources that serve this suite: the machine may list others (a
# vendor's repository) that mean nothing inside the image. Where none does (the
# release workflow's Ubuntu runner), mmdebstrap takes its own defaults for a
# Debian stable suite: the archive with its -updates and -security suites,
# checked with debian-archive-keyring.
mirrors=()
for f in "${sources[@]}"; do
  grep -q "$SUITE" "$f" && mirrors+=("$f")
done
# essential + python3: a smaller root than minbase (no apt, no package
# database beyond dpkg's). Documentation and translations are left out.
mmdebstrap --quiet --variant=essential --architectures="$ARCH" --include="$PACKAGES" \
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
  --dpkgopt='path-exclude=/usr/share/info/*' \
  "$SUITE" "$work/root.tar" "${mirrors[@]}" >&2
bash "$(dirname "$self")/podman.sh" import --quiet --arch "$ARCH" \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'CMD ["python3"]' \
  "$work/root.tar" "$name" >/dev/null
echo "$name"
