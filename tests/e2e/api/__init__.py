"""The e2e tests that need kube-apiserver and etcd (fixtures in conftest.py here)."""
