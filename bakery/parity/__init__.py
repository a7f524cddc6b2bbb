"""The parity matrix: serve DCP 1 and each DCP>1 candidate, compare, summarise.

Job: for each entry of a matrix file (``launcher/dcp2/matrix*.toml``), start a server
through the launcher, capture the suite through the parity harness, stop it, compare
each candidate with the baseline, and write one summary (``summary.md``,
``summary.json``, plots) with what DCP buys beside it (KV capacity, ``vllm bench
serve``). Boundary: launch serves, verify captures and compares; this room only
conducts them (``make verify``, ``run.sh matrix``).
"""
