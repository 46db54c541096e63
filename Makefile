# Every target but test-core sets up .venv on its own (scripts/setup_env.sh caches the Horovod
# wheel outside the checkout) and reinstalls the package when its build inputs change.
# test-core needs no Horovod, torch or TensorFlow: the package and its test extra in .venv-core.
PYTHON ?= python3
PY := .venv/bin/python
CORE_PY := .venv-core/bin/python
BUILD_INPUTS := pyproject.toml setup.py $(wildcard csrc/*.cpp csrc/*.h)
CORE_TESTS := not (horovod or torch or tensorflow)
HOROVODRUN := .venv/bin/horovodrun -np 2 -H localhost:2 --gloo
FRAMEWORK ?= torch
INDEX ?= entropy
VALUE ?= entropy
DENSITY ?= 0.01
GRADIENTS ?= data/digits_gradients.npz

.PHONY: setup test test-core demo demo-baseline bench bench-codecs bench-bloom bench-topk bench-hotpath bench-scaling bench-fuzz bench-hosts bench-synthetic bench-device \
	bench-e2e bench-convergence bench-tta bench-routes capture clean

setup: .venv/.installed

.venv/.installed: scripts/setup_env.sh $(BUILD_INPUTS)
	bash scripts/setup_env.sh
	touch $@

.venv-core/.installed: $(BUILD_INPUTS)
	test -x $(CORE_PY) || $(PYTHON) -m venv .venv-core
	$(CORE_PY) -m pip install -q -e '.[test]'
	touch $@

test: setup
	$(PY) -m pytest -q tests

test-core: .venv-core/.installed
	$(CORE_PY) -m pytest -q -m "$(CORE_TESTS)" tests

# horovodrun imports TensorFlow too (to check Horovod's build), even for a PyTorch job; the
# oneDNN notice is logged before TensorFlow reads its log level, so that turns oneDNN off
demo demo-baseline: export TF_CPP_MIN_LOG_LEVEL = 2
demo demo-baseline: export TF_ENABLE_ONEDNN_OPTS = 0
demo: setup
	$(HOROVODRUN) $(PY) $(FRAMEWORK)/train_digits.py \
		--compression deepreduce --index $(INDEX) --value $(VALUE)

# the dense fp32 run (default epochs and seed) that the demo's closing line compares with
demo-baseline: setup
	$(HOROVODRUN) $(PY) $(FRAMEWORK)/train_digits.py --compression none --no-progress \
		--json docs/digits_dense_$(FRAMEWORK).json

$(GRADIENTS): | setup
	$(PY) torch/capture_gradients.py --out $(GRADIENTS)

capture: $(GRADIENTS)

bench: bench-codecs bench-bloom bench-topk

bench-codecs: setup $(GRADIENTS)
	$(PY) scripts/bench_codecs.py codecs --gradients $(GRADIENTS) --density $(DENSITY)

bench-bloom: setup
	$(PY) scripts/bench_codecs.py bloom --size 25000000 --density $(DENSITY)

bench-topk: setup
	$(PY) scripts/bench_codecs.py topk --size 25000000 --density $(DENSITY)

# the largest captured gradient: compress and the decoding of 32 ranks' payloads beside a copy
bench-hotpath: setup $(GRADIENTS)
	$(PY) scripts/bench_codecs.py hotpath --gradients $(GRADIENTS) --density $(DENSITY) \
		--json docs/hotpath.json

# decode cost for P = 2..64 payloads and where the allgather stops beating a ring allreduce
bench-scaling: setup $(GRADIENTS)
	$(PY) scripts/bench_codecs.py scaling --gradients $(GRADIENTS) --density $(DENSITY) \
		--json docs/decode_scaling.json --plot docs/decode_scaling.png

# 20,000 corrupted payloads of every codec (half with recomputed checksums) and 5,000 with a
# hostile field (counts, shapes, codec ids, Bloom h/m, curves; resealed), in a child process
bench-fuzz: setup
	$(PY) scripts/fuzz.py --mutants 20000 --structural 5000 --json docs/fuzz.json

# as root: 2-rank jobs in a network namespace shaped to 1 Gbit/s and 100 Mbit/s (QUICK=1: < 5 min)
bench-e2e: setup
	$(PY) scripts/bench_e2e.py network $(if $(QUICK),--quick)

# as root: the wide MLP on 2 emulated hosts x 2 ranks, 1 Gbit/s between hosts, flat vs hierarchical
bench-hosts: setup
	$(PY) scripts/bench_e2e.py hosts --repeats 2

# compress time of ResNet-50-sized gradients: device path vs host path (CPU, and CUDA if present)
bench-device: setup
	PYTHONPATH=. $(PY) torch/bench_device_path.py --json docs/device_path.json

# Horovod's synthetic benchmark shape: ResNet-50 on random images, 2 ranks, dense / fp16 / default
# RATE=1gbit (as root): in a namespace shaped to that rate (torch: with DDP PowerSGD and
# compute-only); FRAMEWORK=tf: TensorFlow's; REPEATS=2: two rounds, the second in reverse order;
# CYCLE_MS=10: Horovod's cycle time (--cycle-time-ms) for every configuration
bench-synthetic: setup
	$(PY) scripts/bench_e2e.py synthetic --repeats $(or $(REPEATS),1) $(if $(RATE),--rate $(RATE)) \
		--framework $(FRAMEWORK) $(if $(CYCLE_MS),--cycle-ms $(CYCLE_MS))

# as root: time to accuracy at 1 Gbit/s (wide MLP at 2 and 4 ranks, digits CNN in torch and TF, LSTM; 3 seeds)
bench-tta: setup
	$(PY) scripts/bench_tta.py

# as root: allgather vs sparse allreduce at 2, 4 and 8 ranks, wide MLP at 1 Gbit/s
bench-routes: setup
	$(PY) scripts/bench_routes.py

bench-convergence: setup
	$(PY) scripts/bench_e2e.py convergence $(if $(QUICK),--quick)

clean:
	rm -rf build *.egg-info deepreduce_hvd/*.so .pytest_cache .venv/.installed .venv-core/.installed
