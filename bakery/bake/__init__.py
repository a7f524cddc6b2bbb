"""The bake: fetch the pinned wheel, read and write wheels, BAKED.json, the bake itself."""
