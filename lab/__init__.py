"""The DCP lab, apart from the tool: the pure-torch reference (``lab.dcp``), the CPU
emulation of the CUDA-only kernels (``lab/emulate``, a PYTHONPATH folder), the tiny-model
builders (``lab.tiny_model``, ``lab.tiny_v41``) and the GPU runs (``lab.gpu``). bakery/
imports none of it (tests/test_house_lab.py holds the rules)."""
