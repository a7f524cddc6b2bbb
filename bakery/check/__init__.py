"""Static and import checks of the patched files."""
