"""Secretless pulls: the kubelet's credential-provider plugin asks here for a Pod's mirror
login (:mod:`.endpoint`), its token verified by the API server (:mod:`.tokens`)."""
