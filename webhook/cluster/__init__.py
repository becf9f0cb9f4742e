"""Cluster plumbing: the Kubernetes client, informers, leader election, namespace
opt-in and self-managed serving certificates. Only ``cluster.kube`` talks to the
kubernetes client library."""
