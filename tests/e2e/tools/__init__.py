"""The e2e tests that need only the pinned binaries and registries, or nothing at all."""
