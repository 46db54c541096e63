# Every target sets up .venv on its own (scripts/setup_env.sh is idempotent and caches the
# Horovod wheel outside the checkout).
PY := .venv/bin/python
FRAMEWORK ?= torch
DENSITY ?= 0.01
GRADIENTS ?= data/digits_gradients.npz

.PHONY: setup test demo bench bench-codecs capture clean

setup:
	bash scripts/setup_env.sh

test: setup
	$(PY) -m pytest -q tests

demo: setup
	$(PY) -m deepreduce_hvd.bench codecs --synthetic --density $(DENSITY)

$(GRADIENTS): | setup
	$(PY) torch/capture_gradients.py --out $(GRADIENTS)

capture: $(GRADIENTS)

bench: bench-codecs

bench-codecs: setup $(GRADIENTS)
	$(PY) -m deepreduce_hvd.bench codecs --gradients $(GRADIENTS) --density $(DENSITY)

clean:
	rm -rf build *.egg-info deepreduce_hvd/*.so .pytest_cache
