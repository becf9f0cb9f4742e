"""The e2e tests that need the real node: kubelet, containerd, runc, CNI (marked `node`)."""
