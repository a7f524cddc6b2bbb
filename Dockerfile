# The patched vLLM over the pinned upstream image. The image brings CUDA, torch,
# flashinfer and every other dependency of vllm==0.32.0; the patched wheel has the
# same dependencies, so it replaces only the vllm package itself (--no-deps).
#
#   make bake
#   docker build -t vllm-dcp2 .
#
# Keep the tag at the version of [bases.default] in patches/dcp2/series.toml
# (tests/test_shipping.py checks it).
FROM vllm/vllm-openai:v0.32.0

# The default base's patched wheel (vllm-<version>+dcp2.<sha8>-...whl). `bakery bake`
# keeps one per base in build/dist: with two, pip refuses the double requirement.
COPY build/dist/vllm-*+dcp2.*.whl /tmp/dist/

# --no-deps: the image already holds the dependencies; --force-reinstall: the image's
# vllm has the same version apart from the local label; the last command proves the
# patched build is the one Python now imports metadata from.
RUN python3 -m pip install --no-cache-dir --no-deps --force-reinstall \
        --disable-pip-version-check --root-user-action=ignore /tmp/dist/*.whl \
    && rm -rf /tmp/dist \
    && python3 -c "import importlib.metadata as m; v = m.version('vllm'); assert '+dcp2.' in v, v"
