"""bakery: bake an ordered patch series onto a pinned, hash-verified vLLM wheel.

Mental model: a *series* (patches/<name>/series.toml + per-file diffs) is applied
in memory to a *pristine* tree extracted from a pinned wheel; only when every hunk
is placed is a *baked* tree swapped into place, with a manifest and a patched wheel.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
