# The two set-up commands of the README:  `make run`  and  `make test`.
# Both create .venv if needed, install the package (idempotent), then do their job.
VENV     ?= .venv
PY       := $(VENV)/bin/python
STAMP    := $(VENV)/.installed
# make run: every core of this machine; the model jobs claim them all (WHOLE_MACHINE in
# workflow/rules/common.smk), so only single-core jobs (preparation, items, tables) pair up.
CORES    ?= $(shell nproc 2>/dev/null || echo 1)
CONFIG   ?= config/config.yaml
# torch: CPU machines get the CPU build (on local disk here). Where nvidia-smi exists the venv
# must hold a CUDA build: a missing torch, or a CPU-only build already in the venv (which would
# run the paper grid on the CPU), is replaced by TORCH_CUDA_SPEC from TORCH_CUDA_INDEX (PyTorch's
# CUDA 12.8 wheels; override both for another CUDA). Either way the install ends by printing
# which torch it uses, its CUDA version and whether it sees a GPU.
HAS_GPU          := $(shell command -v nvidia-smi >/dev/null 2>&1 && echo yes)
TORCH_SPEC       ?= torch==2.13.0
TORCH_CUDA_SPEC  ?= torch
TORCH_CUDA_INDEX ?= https://download.pytorch.org/whl/cu128

.PHONY: install run test test-fast test-kernels test-kernels-quick test-slurm dryrun lint lock clean-results

install: $(STAMP)

# Dependencies come at the versions of requirements.lock (-c: the lock constrains, pyproject.toml
# says what is needed): the package with its test and harness extras (lm-eval, Inspect).
$(STAMP): pyproject.toml requirements.lock
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
ifeq ($(HAS_GPU),yes)
	@$(PY) -c "import torch, sys; sys.exit(0 if torch.version.cuda else 1)" 2>/dev/null || { \
	  echo "make: nvidia-smi found and .venv has no CUDA build of torch: installing $(TORCH_CUDA_SPEC) from $(TORCH_CUDA_INDEX)"; \
	  $(PY) -m pip uninstall -q -y torch 2>/dev/null; \
	  $(PY) -m pip install -q "$(TORCH_CUDA_SPEC)" --index-url "$(TORCH_CUDA_INDEX)"; }
else
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_SPEC)"
endif
	$(PY) -m pip install -q -c requirements.lock -e ".[test,harness]"
	@$(PY) -c "import torch; print(f'make: torch {torch.__version__}, CUDA build: {torch.version.cuda or \"none (CPU-only build)\"}, GPU visible: {torch.cuda.is_available()}')"
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/snakemake --cores $(CORES) --resources gpu=1 --configfile $(CONFIG) --profile profiles/default

dryrun: $(STAMP)
	$(VENV)/bin/snakemake -n --cores $(CORES) --resources gpu=1 --configfile $(CONFIG) --profile profiles/default

# Tests marked slurm need a Slurm cluster: they run in `make test-slurm` (the CI's last step).
# `make test` runs the suite in two parts, both always, and fails if either failed:
#   - the tests not marked slow (the `make test-fast` tier) in FAST_WORKERS pytest-xdist
#     processes, one test file each at a time: they are short and mostly wait on subprocesses,
#     sockets and deadlines, so on 2 cores two processes take 135 s where one takes 228 s
#     (benchmarks/RESULTS.md section 16); FAST_WORKERS=0 runs them in one process;
#   - the slow tests (real models, whole workflows) in TEST_WORKERS processes (2 where there are
#     2 cores or more; 0 means one), each on its own share of the CPUs, which its model workers
#     and jobs inherit (SAFETYREPRO_TEST_SPLIT_CPUS, tests/conftest.py): two processes sharing all
#     CPUs were 1.5x slower than one (section 15: their torch threads preempt each other), two on
#     a core each are faster (section 18). tests/conftest.py starts the files with slow tests first.
FAST_WORKERS ?= 2
TEST_WORKERS ?= $(if $(filter 0 1,$(shell nproc 2>/dev/null || echo 1)),0,2)
FAST_XDIST := $(if $(filter 0,$(FAST_WORKERS)),,-n $(FAST_WORKERS) --dist loadfile)
XDIST := $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)
test: $(STAMP)
	@rc=0; \
	echo "make test: 1 of 2, the tests not marked slow"; \
	$(VENV)/bin/python -m pytest -q -m "not slow and not slurm" $(FAST_XDIST) --durations=15 || rc=1; \
	echo "make test: 2 of 2, the slow tests"; \
	SAFETYREPRO_TEST_SPLIT_CPUS=1 $(VENV)/bin/python -m pytest -q -m "slow and not slurm" $(XDIST) --durations=30 || rc=1; \
	exit $$rc

# The edit loop's tier: every test not marked slow (real models, whole workflows, full dry runs,
# Monte-Carlo sizes, fuzzing) and not slurm. It proves less than `make test`, the complete suite.
test-fast: $(STAMP)
	$(VENV)/bin/python -m pytest -q -m "not slow and not slurm" $(FAST_XDIST)

# The numerical tests (marked numerics; tests/numerics.py states their rule) again with other CPU
# kernels, so one machine catches what another CPU family would fail: ATen's generic kernels with
# MKL's compatible code path and oneDNN at SSE4.1 (a third kernel family on any x86-64 CPU); on a
# CPU with AVX-512 also AVX2 at most (what older Intel and pre-Zen-4 AMD EPYC CPUs run).
KERNELS_GENERIC := ATEN_CPU_CAPABILITY=default MKL_CBWR=COMPATIBLE ONEDNN_MAX_CPU_ISA=SSE41
KERNELS_AVX2    := ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2
HAS_AVX512      := $(shell grep -qw avx512f /proc/cpuinfo 2>/dev/null && echo yes)

KERNEL_TESTS    ?= numerics and not slurm

test-kernels: $(STAMP)
	$(KERNELS_GENERIC) $(VENV)/bin/python -m pytest -q -m "$(KERNEL_TESTS)"
ifeq ($(HAS_AVX512),yes)
	$(KERNELS_AVX2) $(VENV)/bin/python -m pytest -q -m "$(KERNEL_TESTS)"
else
	@echo "test-kernels: this CPU has no AVX-512, so its default run of the suite already used AVX2 kernels"
endif

# CI's share of it: the numerical tests not marked slow (kernels, sampler, bounds, the
# forward-select test that failed on AMD EPYC; 44 tests, about 15 s per kernel family on 2 quiet
# cores). The slow, whole-model ones add 5-10 min per family there: `make test-kernels`.
test-kernels-quick:
	$(MAKE) test-kernels KERNEL_TESTS="numerics and not slow and not slurm"

# Starts a single-node Slurm cluster on this machine (root; Debian/Ubuntu), runs the tests
# marked slurm against it, and tears it down again. See docs/SLURM.md.
test-slurm: $(STAMP)
	PY=$(PY) .ci/slurm/test.sh

lint: $(STAMP)
	$(VENV)/bin/snakemake --lint --configfile $(CONFIG)
	$(VENV)/bin/snakefmt --check Snakefile workflow/rules

# Rewrite requirements.lock from .venv (after e.g. `$(PY) -m pip install -U -e ".[test,harness]"`
# and `make test`): every installed distribution but the project itself, pip and torch.
LOCK_HEADER := \
  "\# The tested versions of every dependency (runtime, test and harness extras) except torch, which" \
  "\# the Makefile installs first (CPU or CUDA build). Linux x86-64, Python 3.11. make installs with" \
  "\# -c requirements.lock, so a rerun later gets these versions; make lock rewrites it (Makefile)."

lock: $(STAMP)
	{ printf '%s\n' $(LOCK_HEADER); \
	  $(PY) -m pip freeze --all --exclude-editable | grep -v -i -E '^(pip|torch|wheel)=='; } > requirements.lock.tmp
	mv requirements.lock.tmp requirements.lock

clean-results:
	rm -rf results/
