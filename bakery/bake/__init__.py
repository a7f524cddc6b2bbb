"""The bake: fetch (the pinned wheel), wheel (read, extract, write the patched copy),
record (RECORD as CSV), zipwriter (raw-copy zip writer), manifest (BAKED.json), and
bake (the pipeline that moves data between them)."""
