# The patched vLLM over the pinned upstream image, with the launcher and its gates. The
# image brings CUDA, torch, flashinfer and every other dependency of vllm==0.34.0; the
# patched wheel has the same dependencies, so it replaces only the vllm package itself
# (--no-deps).
#
#   make bake
#   docker build -t vllm-dcp2 .
#   docker run --gpus all --ipc=host -p 8000:8000 -v /models:/models vllm-dcp2 \
#       --profile dsv41-sm120-tp2-dcp2 --model /models/DeepSeek-V4.1
#
# Keep the tag at the version of [bases.default] in patches/dcp2/series.toml
# (tests/test_shipping.py checks it).
FROM vllm/vllm-openai:v0.34.0

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

# The launcher (run.sh, preflight, the DSV41_* gates of patches/dcp2/stages.toml, the
# profiles) with bakery in a venv of its own, so bakery's pins never touch vLLM's.
# vllm-python runs the Python that serves (the launcher's --python; a wrapper, not a
# symlink, so a venv'd python3 keeps its venv).
COPY pyproject.toml /opt/bakery/src/
COPY bakery /opt/bakery/src/bakery
COPY patches /opt/bakery/src/patches
COPY launcher /opt/bakery/src/launcher
RUN python3 -m venv --without-pip /opt/bakery/venv \
    && python3 -m pip --python /opt/bakery/venv/bin/python install --no-cache-dir \
        --disable-pip-version-check --root-user-action=ignore /opt/bakery/src \
    && printf '#!/bin/sh\nexec %s "$@"\n' "$(command -v python3)" > /opt/bakery/vllm-python \
    && chmod 755 /opt/bakery/vllm-python

# The series' profiles serve DeepSeek-V4.1 at stage 4 (candidate blocks); a plain
# `vllm serve` in this image gets the same stage instead of the stage table's default 3.
ENV BAKERY_PYTHON=/opt/bakery/venv/bin/python \
    DSV41_DCP_STAGE=4
WORKDIR /opt/bakery/src
EXPOSE 8000
# Preflight first (every refusal in one message, exit 3), then vLLM in the foreground of
# the container; `docker stop` stops it through the launcher.
ENTRYPOINT ["/opt/bakery/src/launcher/dcp2/container.sh", "--installed", \
            "--python", "/opt/bakery/vllm-python", "--host", "0.0.0.0"]
CMD ["--profile", "dsv41-sm120-tp2-dcp2", "--model", "/models/DeepSeek-V4.1"]
