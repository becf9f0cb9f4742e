#!/usr/bin/env bash
# podman as the project runs it (image/build.sh, image/debian-base.sh, the
# image tests): with runc, because Debian 12's crun 1.8 refuses hosts in
# cgroup v1 "hybrid" mode (this VM: "cgroups in hybrid mode not supported"),
# while runc runs on v1, hybrid and v2 alike. Storage stays podman's own
# (overlay under /var/lib/containers as root), apart from any containerd's.
exec podman --runtime=runc "$@"
