"""The HTTP edge: the ASGI app, TLS, connections and their limits, reviews, metrics.

It serves admission over HTTPS and knows nothing of the cluster: what it needs
from there (pull secrets, health) reaches it as values through ``app.Runtime``.
"""
