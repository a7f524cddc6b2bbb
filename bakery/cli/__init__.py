"""The command line: the root group (root.py), the one error boundary (boundary.py),
and one module per command group."""
