"""`mirrorgate serve`: :mod:`.settings` (what the flags give), :mod:`.wiring` (the composition
root: every component built once) and :mod:`.process` (listen, serve, exit on SIGTERM).

Nothing is imported here, so that the command line reads the settings without loading the
server.
"""
