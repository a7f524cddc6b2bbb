"""The DCP reference model and the baked-kernel loader (needs the `dcp` extra: torch)."""
