# Two commands from a fresh clone: `make demo` and `make test`. Each builds .venv first.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-$(shell cksum < requirements.txt | cut -d' ' -f1)

export PYTHONPATH := $(CURDIR)
# one BLAS thread per process: ranks run oversubscribed on a laptop's few cores
export OMP_NUM_THREADS ?= 1

.PHONY: demo test grade lessons doctor bench clean help

help:
	@echo "make demo     run the main job (sets up .venv on first use)"
	@echo "make test     run the whole suite: library tests, graders (reference), meta-tests, lessons"
	@echo "make grade    grade YOUR exercises in exercises/ and print a summary (EX=ex03: one exercise)"
	@echo "make lessons  re-execute every notebook in place (outputs are committed)"
	@echo "make doctor   check Python, numpy, torch, gloo, MPI and jupyter"
	@echo "make bench    from-scratch vs native all-reduce and one ring step, under mpiexec and torchrun (RANKS=2)"

$(STAMP): requirements.txt
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "Python 3.10 or newer is needed; set PYTHON=python3.x")'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	@# make the repo importable from anywhere in the venv (jupyter lab, torchrun, mpiexec), no build step
	$(PY) -c 'import os, site; open(os.path.join(site.getsitepackages()[0], "tp_from_scratch.pth"), "w").write(os.getcwd() + "\n")'
	rm -f $(VENV)/.installed-* && touch $@

# The main job: a tp=2 GPT trained by 2 CPU processes, each loss next to the single-device one
demo: $(STAMP)
	$(VENV)/bin/torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.gpt.train --tp 2 --steps 50 \
		--compare-single --metrics runs/demo/metrics.jsonl --plot runs/demo/loss.png

# The suite runs on TEST_WORKERS processes (pytest-xdist); --dist loadfile keeps each test file on
# one worker, so a file's module-scoped launches (torchrun runs, grader subprocesses) happen once
TEST_WORKERS ?= 2
test: $(STAMP)
	TP_IMPL=reference $(PY) -m pytest exercises -q
	$(PY) -m pytest tests -q -n $(TEST_WORKERS) --dist loadfile
	$(PY) -m pytest --nbmake lessons -q -n $(TEST_WORKERS)

# make grade EX=ex03 grades one exercise; COLLECTIVES=mine runs Exercises 3-6 on your own ex02 ring
grade: $(STAMP)
	$(PY) -m tp_from_scratch.tools.grade $(foreach e,$(EX),--exercise $(e)) $(if $(COLLECTIVES),--collectives $(COLLECTIVES))

lessons: $(STAMP)
	$(VENV)/bin/jupyter nbconvert --to notebook --execute --inplace lessons/*.ipynb

doctor: $(STAMP)
	$(PY) -m tp_from_scratch.tools.doctor

# The figures in the README's "Measured figures": printed side by side, JSON in runs/bench/
RANKS ?= 2
BENCH_ALL_REDUCE := collectives --ops all_reduce --min-bytes 1M --max-bytes 16M --factor 4
bench: $(STAMP)
	$(VENV)/bin/mpiexec -n $(RANKS) $(PY) -m tp_from_scratch.bench $(BENCH_ALL_REDUCE) --json runs/bench/all_reduce_mpi$(RANKS).json
	$(VENV)/bin/torchrun --standalone --nproc-per-node $(RANKS) -m tp_from_scratch.bench $(BENCH_ALL_REDUCE) --json runs/bench/all_reduce_torch$(RANKS).json
	$(VENV)/bin/mpiexec -n $(RANKS) $(PY) -m tp_from_scratch.bench p2p --json runs/bench/p2p_mpi$(RANKS).json
	$(VENV)/bin/torchrun --standalone --nproc-per-node $(RANKS) -m tp_from_scratch.bench p2p --json runs/bench/p2p_torch$(RANKS).json

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis runs
