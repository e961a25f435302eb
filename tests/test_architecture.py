"""The package's shape, read from its source: each folder is one layer and imports point only downward;
claims never import claims; one implementation of each equation and of atomic writing."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "dynheads_tl"

# Lower numbers are lower layers; a module may import only modules of its own layer or below.
LAYERS = {
    "store": 0, "tasks": 0, "progress": 0, "preregistration": 0, "params": 0,
    "engine": 1,
    "config": 2, "claim": 2, "analysis": 2, "executors": 2, "verdicts": 2, "results_schema": 2,
    "protocols": 3,
    "corpus": 4,
    "claims": 5,
    "report": 6,
}


def _unit(module: str) -> str:
    """``dynheads_tl.engine.tracing`` -> ``engine``; ``dynheads_tl.corpus`` -> ``corpus``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        dotted = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        found[dotted.removesuffix(".__init__")] = path
    return found


def _imports(module: str, path: Path) -> set[str]:
    """Every ``dynheads_tl`` module that ``module`` imports, at the top or inside functions."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    imported = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names if alias.name.startswith("dynheads_tl")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            if target.startswith("dynheads_tl"):
                imported.add(target)
                imported |= {f"{target}.{alias.name}" for alias in node.names}
    return imported


def _claim(module: str) -> str:
    """``dynheads_tl.claims.irreplaceability.report`` -> ``irreplaceability``; the claims package itself -> ""."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 else ""


def test_every_module_belongs_to_a_layer():
    units = {_unit(module) for module in _modules()} - {""}
    assert units <= set(LAYERS), f"modules outside the known layers: {sorted(units - set(LAYERS))}"


def violations(graph: dict[str, set[str]]) -> tuple[list[str], list[str]]:
    """(imports that point up a layer, claims importing other claims) in a module -> imports graph."""
    upward, between_claims = [], []
    for module, targets in graph.items():
        unit = _unit(module)
        if not unit:
            continue  # the package's __init__ re-exports the public API
        for target in targets:
            if target not in graph:
                continue  # a name imported from a module, already counted as the module
            other = _unit(target)
            if other and LAYERS[other] > LAYERS[unit]:
                upward.append(f"{module} imports {target}")
            if unit == "claims" == other and _claim(target) not in ("", _claim(module)):
                between_claims.append(f"{module} imports {target}")
    return upward, between_claims


def test_imports_point_only_downward_and_claims_never_import_claims():
    graph = {module: _imports(module, path) for module, path in _modules().items()}
    upward, between_claims = violations(graph)
    assert not upward, "imports that point up a layer:\n" + "\n".join(upward)
    assert not between_claims, "claims importing claims (put what they share in corpus):\n" + "\n".join(between_claims)


def unit_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The circles of imports between units (layer folders and top-level modules) in a module -> imports graph: the
    strongly connected groups of two or more units. Modules of one unit may import each other; two units that
    import each other, even both of one layer, are one unit in disguise (or one of them holds a part of the other)."""
    edges: dict[str, set[str]] = {}
    for module, targets in graph.items():
        unit = _unit(module)
        if unit:
            edges.setdefault(unit, set()).update(_unit(t) for t in targets if t in graph and _unit(t) not in ("", unit))
    reach = {unit: set() for unit in edges}
    for unit in edges:  # the units reachable from each (a few dozen edges: a walk from each is enough)
        stack = list(edges[unit])
        while stack:
            other = stack.pop()
            if other not in reach[unit]:
                reach[unit].add(other)
                stack.extend(edges.get(other, ()))
    circles = {tuple(sorted({unit} | {o for o in reach[unit] if unit in reach.get(o, ())}))
               for unit in edges if unit in reach[unit]}
    return [list(circle) for circle in sorted(circles)]


def test_no_two_units_import_each_other():
    graph = {module: _imports(module, path) for module, path in _modules().items()}
    circles = unit_circles(graph)
    assert not circles, "units that import each other (directly or around a circle): " + "; ".join(
        " <-> ".join(circle) for circle in circles)


def test_the_circle_rule_finds_a_circle_between_units_and_allows_one_inside_a_unit():
    graph = {"dynheads_tl.config": {"dynheads_tl.analysis.head_files"},
             "dynheads_tl.analysis.head_files": {"dynheads_tl.config"},
             "dynheads_tl.report.site": {"dynheads_tl.report.index"},
             "dynheads_tl.report.index": {"dynheads_tl.report.site", "dynheads_tl.config"}}
    assert unit_circles(graph) == [["analysis", "config"]]
    del graph["dynheads_tl.analysis.head_files"]
    assert unit_circles(graph) == []
    around = {"dynheads_tl.engine.a": {"dynheads_tl.tasks.b"}, "dynheads_tl.tasks.b": {"dynheads_tl.store"},
              "dynheads_tl.store": {"dynheads_tl.engine.a"}, "dynheads_tl.report.x": {"dynheads_tl.engine.a"}}
    assert unit_circles(around) == [["engine", "store", "tasks"]]  # a circle through three units; report is outside it


def test_the_rules_catch_an_upward_import_and_a_claim_importing_a_claim():
    graph = {"dynheads_tl.engine.tracing": {"dynheads_tl.report.figures"}, "dynheads_tl.report.figures": set(),
             "dynheads_tl.claims.correlation.pipeline": {"dynheads_tl.claims.dynamism.pipeline",
                                                         "dynheads_tl.claims.correlation.config"},
             "dynheads_tl.claims.dynamism.pipeline": set(), "dynheads_tl.claims.correlation.config": set()}
    upward, between_claims = violations(graph)
    assert upward == ["dynheads_tl.engine.tracing imports dynheads_tl.report.figures"]
    # a claim's own modules may import each other; another claim's may not
    assert between_claims == ["dynheads_tl.claims.correlation.pipeline imports dynheads_tl.claims.dynamism.pipeline"]


def module_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The circles of imports between modules (Tarjan's strongly connected groups of two or more modules, or a
    module importing itself), at the top of a module or inside a function: two modules of one folder that import
    each other are one module in disguise, and a function-local import only hides the circle."""
    edges = {module: {t for t in targets if t in graph} for module, targets in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for other in sorted(edges[module]):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in on_stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == module:
                    break
            if len(group) > 1 or module in edges[module]:
                circles.append(sorted(group))

    for module in sorted(edges):
        if module not in index:
            visit(module)
    return sorted(circles)


def test_no_module_imports_itself_around_a_circle():
    graph = {module: _imports(module, path) for module, path in _modules().items()}
    circles = module_circles(graph)
    assert not circles, "modules that import each other (directly or around a circle): " + "; ".join(
        " <-> ".join(circle) for circle in circles)


def test_the_module_circle_rule_finds_a_circle_inside_a_layer():
    graph = {"dynheads_tl.report.findings": {"dynheads_tl.report.index"},
             "dynheads_tl.report.index": {"dynheads_tl.report.site"},
             "dynheads_tl.report.site": {"dynheads_tl.report.findings", "dynheads_tl.store"},
             "dynheads_tl.store": set(), "dynheads_tl.report.cli": {"dynheads_tl.report.index"}}
    assert module_circles(graph) == [["dynheads_tl.report.findings", "dynheads_tl.report.index",
                                      "dynheads_tl.report.site"]]
    graph["dynheads_tl.report.site"] = {"dynheads_tl.store"}
    assert module_circles(graph) == []


def report_imports_of_claims(graph: dict[str, set[str]]) -> list[str]:
    """Imports of a claim's modules (``dynheads_tl.claims.<name>...``) by the report layer, which reads claims only
    through the discovery in ``dynheads_tl.claims`` and what each claim declares."""
    return sorted(f"{module} imports {target}" for module, targets in graph.items() if _unit(module) == "report"
                  for target in targets if target.startswith("dynheads_tl.claims.") and _claim(target)
                  and f"dynheads_tl.claims.{_claim(target)}" in graph)


def test_the_report_layer_imports_no_claim_module():
    graph = {module: _imports(module, path) for module, path in _modules().items()}
    found = report_imports_of_claims(graph)
    assert not found, "the report layer names a claim (move the code into claims/<name>/):\n" + "\n".join(found)
    faked = {**graph, "dynheads_tl.report.extra": {"dynheads_tl.claims.irreplaceability.config"}}
    assert report_imports_of_claims(faked) == [
        "dynheads_tl.report.extra imports dynheads_tl.claims.irreplaceability.config"], "the check can fail"


def _definitions(pattern: str) -> list[str]:
    hits = []
    for path in PACKAGE.rglob("*.py"):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(pattern, line):
                hits.append(f"{path.relative_to(ROOT)}:{number}")
    return hits


@pytest.mark.parametrize("what, pattern, home", [
    ("atomic write (rename into place)", r"os\.replace\(tmp|mkstemp\(", "dynheads_tl/store.py"),
    ("Eq. 1 (argmax in evidence and == token)", r"\]\s*==\s*tokens?\b.*|ids\[argmax_pos\]", "dynheads_tl/engine/equations.py"),
    ("Eq. 2 (evidence share among eligible keys)", r"einsum\(\"bhk,bk->bh\"", "dynheads_tl/engine/equations.py"),
    ("the L{layer}H{head} label", r"f\"L\{", "dynheads_tl/engine/equations.py"),
    ("the evidence mask from spans", r"(mask|evidence)\[(start|s_):(end|e_)\] = True", "dynheads_tl/engine/equations.py"),
    ("seed mixing (seed x stride + index)", r"seed\s*\*\s*(\d[\d_]*|stride)\s*\+", "dynheads_tl/tasks/common.py"),
])
def test_one_implementation_of_each_equation_and_of_atomic_writing(what, pattern, home):
    places = _definitions(pattern)
    assert places and all(p.startswith(home) for p in places), f"{what} is written in {places}, not only in {home}"


MAX_MODULE_LINES = 500  # issue #29: a module that grows past this does more than one job; split it


def test_no_module_is_over_500_lines():
    long = {name: n for name, path in _modules().items() if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split them by job): {long}"


def test_every_environment_variable_the_package_reads_is_documented_in_one_place():
    """docs/architecture.md's table names every environment variable the package reads (the string literals of
    DYNHEADS_* names, HF_HUB_OFFLINE and CHROMIUM in dynheads_tl/), and names none the package no longer reads."""
    import re

    package = Path(__file__).resolve().parent.parent / "dynheads_tl"
    read = set()
    for path in package.rglob("*.py"):
        read |= set(re.findall(r"[\"'](DYNHEADS_[A-Z_]+|HF_HUB_OFFLINE|CHROMIUM)[\"']", path.read_text()))
    doc = (package.parent / "docs" / "architecture.md").read_text()
    table = doc[doc.index("**Environment variables**"):]
    documented = set(re.findall(r"^\| `([A-Z_]+)` \|", table, re.M))
    assert read and read == documented, (sorted(read - documented), sorted(documented - read))


def local_package_imports(source: str) -> list[int]:
    """Lines where a function or method imports one of the package's own modules. The package's imports sit at the
    top of each module, where the layer and circle rules above can see them at a glance; heavy optional third-party
    imports (Ray, circuitsvis) may stay inside the function that needs them."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for inner in ast.walk(node):
                if isinstance(inner, ast.ImportFrom) and (inner.level or (inner.module or "").startswith("dynheads_tl")):
                    lines.append(inner.lineno)
                elif isinstance(inner, ast.Import) and any(a.name.startswith("dynheads_tl") for a in inner.names):
                    lines.append(inner.lineno)
    return sorted(set(lines))


def test_the_package_imports_its_own_modules_only_at_module_level():
    found = [f"{path.relative_to(ROOT)}:{line}" for path in _modules().values()
             for line in local_package_imports(path.read_text())]
    assert not found, "function-local imports of the package's own modules (move them to the top): " + ", ".join(found)


def test_the_local_import_rule_finds_one_inside_a_method_and_ignores_third_party_ones():
    source = ("import torch\nfrom dynheads_tl.store import cache_dir\n\n"
              "class A:\n    def f(self):\n        import ray\n        from .pipeline import run\n        return run\n\n"
              "def g():\n    import dynheads_tl.engine.models as m\n    return m\n")
    assert local_package_imports(source) == [7, 11]
