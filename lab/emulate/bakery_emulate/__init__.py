"""Torch stand-ins for CUDA-only kernels, loaded by ``lab/emulate/sitecustomize.py``."""
