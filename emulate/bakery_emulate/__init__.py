"""Torch stand-ins for CUDA-only kernels, loaded by ``emulate/sitecustomize.py``."""
