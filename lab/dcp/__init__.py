"""The lab's DCP math: the pure-torch reference model (``reference``), the one copy of the
merge math (``merge``) and the baked-kernel loader (``baked_kernels``).

Needs torch: the ``dcp`` extra (``pip install -e '.[dcp]'``; the test extra takes it, so
``make test`` installs it). Running the baked kernels also needs Triton, imported only when a
kernel is loaded. Nothing else: lab/gpu (the bodies of tools/gpu_*.py) imports it on a host
with only torch and Triton (no click, no vLLM); tests/lab/dcp/test_dcp_reference.py checks
that.
"""
