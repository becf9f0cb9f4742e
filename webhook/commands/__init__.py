"""Everything behind a CLI verb: serve, audit, export, rewrite and explain,
credentials check. The top layer: commands may use every other part of the
webhook; nothing below imports them."""
