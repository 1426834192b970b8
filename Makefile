# Both targets create .venv and install what they need by themselves.
# torch==2.13.0 is installed first and explicitly: on these machines it is a local CPU
# wheel, and letting pip resolve torch through a dependency would pull CUDA wheels.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.superkernel-installed

.PHONY: demo test bench clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "torch==2.13.0"
	$(PY) -m pip install --quiet -c constraints.txt -e ".[tools,onnx,quant,dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/superkernel optimize

test: $(STAMP)
	$(PY) -m pytest -q -n auto --maxprocesses 4 --dist loadfile

bench: $(STAMP)
	$(PY) benchmarks/run_all.py

clean:
	rm -rf $(VENV) superkernel_out
