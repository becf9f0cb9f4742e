"""Registry credentials: where they come from and how they reach a Pod's namespace.

- :mod:`.store`: the value type (:class:`~.store.Credential`), the
  ``.dockerconfigjson`` payload, and the store protocol every source implements;
- :mod:`.filestore` and :mod:`.kubestore`: the encrypted file and the
  Kubernetes Secret sources;
- :mod:`.pullsecrets`: the provisioner that makes a namespace's pull secret
  before its Pod is admitted, and :mod:`.reconciler`, the leader's rotation,
  healing and clean-up of those copies, with :mod:`.records` (what mirrorgate
  made) and :mod:`.fingerprints` (whether it is current).
"""
