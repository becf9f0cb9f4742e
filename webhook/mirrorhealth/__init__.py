"""Mirror and credential health: the probes and the monitor that turns their
results into the ``policy.Health`` value admission reads from memory."""
