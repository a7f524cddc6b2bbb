"""The GPU runs of the DCP lab: torch and Triton, no vLLM, no click (tests/lab/dcp holds them
to it). Each run's doors are tools/gpu_*.py; docs/gpu-dcp.md has the commands and numbers."""
