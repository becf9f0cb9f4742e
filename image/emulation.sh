#!/usr/bin/env bash
# Runs a command with the binaries of another architecture executable here,
# through Debian's qemu-user-static (installed when missing, with arch-test):
#
#   image/emulation.sh arm64 COMMAND...
#
# The kernel runs a foreign binary through binfmt_misc: the filesystem is
# mounted and qemu's handler registered only for the command's duration, and
# both are undone afterwards unless they were there before (a host change,
# undone by whoever made it). The handler carries Debian's flags, F among them:
# the kernel opens the interpreter at registration, so it also works inside
# containers, which do not have it in their own root.
#
# Exit 3, with the reason, when emulation cannot run here (a kernel without
# binfmt_misc, or not root): the caller builds the native architecture alone.
set -euo pipefail
arch="$1"; shift
[[ "$arch" == "$(dpkg --print-architecture)" ]] && exec "$@"  # native: nothing to emulate
case "$arch" in
  arm64) qemu=aarch64 ;;
  *) echo "emulation.sh: no emulation set up for $arch (only arm64)" >&2; exit 2 ;;
esac

binfmt=/proc/sys/fs/binfmt_misc
if ! grep -qw binfmt_misc /proc/filesystems; then
  echo "emulation.sh: this kernel has no binfmt_misc, so $arch binaries cannot run here" >&2
  exit 3
fi
if [[ "$(id -u)" != 0 ]]; then
  echo "emulation.sh: registering qemu with binfmt_misc needs root" >&2
  exit 3
fi
# arch-test: how mmdebstrap checks that the foreign architecture runs.
missing=()
[[ -x /usr/bin/qemu-$qemu-static ]] || missing+=(qemu-user-static)
command -v arch-test >/dev/null || missing+=(arch-test)
bash "$(dirname "$0")/../tools/apt-install.sh" emulation.sh "${missing[@]}"

undo=()
cleanup() {
  local step
  for step in "${undo[@]}"; do eval "$step" || true; done
}
trap cleanup EXIT
if [[ ! -e "$binfmt/register" ]]; then
  mount -t binfmt_misc binfmt_misc "$binfmt"
  undo=("umount $binfmt" "${undo[@]}")
fi
if [[ ! -e "$binfmt/qemu-$qemu" ]]; then
  # Debian's own registration line (magic, mask, interpreter and flags).
  cat "/usr/lib/binfmt.d/qemu-$qemu.conf" > "$binfmt/register"
  undo=("echo -1 > $binfmt/qemu-$qemu" "${undo[@]}")
fi
"$@"
