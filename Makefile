# Every target sets up .venv on its own (scripts/setup_env.sh is idempotent and caches the
# Horovod wheel outside the checkout).
PY := .venv/bin/python
FRAMEWORK ?= torch
INDEX ?= entropy
VALUE ?= entropy
DENSITY ?= 0.01
GRADIENTS ?= data/digits_gradients.npz

.PHONY: setup test demo bench bench-codecs bench-bloom capture clean

setup:
	bash scripts/setup_env.sh

test: setup
	$(PY) -m pytest -q tests

demo: setup
	.venv/bin/horovodrun -np 2 -H localhost:2 --gloo $(PY) $(FRAMEWORK)/train_digits.py \
		--compression deepreduce --index $(INDEX) --value $(VALUE)

$(GRADIENTS): | setup
	$(PY) torch/capture_gradients.py --out $(GRADIENTS)

capture: $(GRADIENTS)

bench: bench-codecs bench-bloom

bench-codecs: setup $(GRADIENTS)
	$(PY) -m deepreduce_hvd.bench codecs --gradients $(GRADIENTS) --density $(DENSITY)

bench-bloom: setup
	$(PY) -m deepreduce_hvd.bench bloom --size 25000000 --density $(DENSITY)

clean:
	rm -rf build *.egg-info deepreduce_hvd/*.so .pytest_cache
