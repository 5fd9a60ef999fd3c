"""The modules of ``kvdispatch/``, ``kernels_triton/`` and ``kernels_cupy/`` form layers: no module imports,
directly or through others, a module that imports it back.

Read from the source with ``ast``: every ``import`` and ``from ... import`` anywhere in a module (module level,
inside functions, under ``if TYPE_CHECKING``), relative ones resolved, and ``importlib.import_module`` of a
literal name. ``from package import name`` imports the submodule ``package.name`` where there is one, else
``package``. That importing a submodule runs its packages' ``__init__`` first is not counted: a package that
imports its own submodules is no circle. Nor are the imports by a name held in data: the backends
``dispatch.DESCRIPTORS`` names and loads at their first selection, the submodules of a lazy package
(``kvdispatch._lazy``).
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("kvdispatch", "kernels_triton", "kernels_cupy")


def project_modules() -> dict[str, Path]:
    """Dotted name -> source file, for every module of ``PACKAGES`` (a package is its ``__init__.py``)."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def imports(module: str, path: Path, modules: dict[str, Path]) -> dict[str, int]:
    """The modules of ``modules`` that ``module`` (its source at ``path``) imports, each with the first line
    that does."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: dict[str, int] = {}

    def add(name: str, line: int) -> None:
        while name and name not in modules:  # ``import a.b.c`` of a non-module ``c``: the module above it
            name = name.rpartition(".")[0]
        if name and name != module:
            found.setdefault(name, line)

    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                add(submodule if submodule in modules else base, node.lineno)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            add(node.args[0].value, node.lineno)
    return found


def import_graph() -> dict[str, dict[str, int]]:
    """Module -> {project module it imports: the first line that does}."""
    modules = project_modules()
    return {module: imports(module, path, modules) for module, path in modules.items()}


def find_cycle(graph: dict[str, dict[str, int]]) -> list[str] | None:
    """One cycle of ``graph`` as ``[a, b, ..., a]``, or None when it has none."""
    done, path = set(), []

    def visit(module):
        path.append(module)
        for target in graph[module]:
            if target in path:
                return path[path.index(target):] + [target]
            if target not in done and (cycle := visit(target)):
                return cycle
        done.add(path.pop())
        return None

    for module in graph:
        if module not in done and (cycle := visit(module)):
            return cycle
    return None


def test_the_graph_sees_every_kind_of_import():
    """The parser finds module-level, function-level, relative, absolute and ``import_module`` imports (else
    the test below would pass on an empty graph)."""
    graph = import_graph()
    assert "kvdispatch.devices" in graph["kvdispatch.dispatch"]  # from . import devices
    assert "kvdispatch.grid" in graph["kvdispatch.dispatch"]  # from .grid import GridLimitError
    assert "kvdispatch.bench.baselines" in graph["kvdispatch.bench.core"]  # importlib.import_module("...")
    assert "kernels_cupy.runtime" in graph["kernels_cupy.native"]  # inside a function
    assert "kvdispatch.host_path" in graph["kernels_triton.native"]  # from kvdispatch import host_path
    assert "kvdispatch" in graph["kvdispatch.info"]  # import kvdispatch
    assert set(graph["kernels_triton.token_csr"]) >= {"kernels_triton.launch", "kernels_triton.native",
                                                      "kernels_triton.page_table"}


def test_modules_form_layers():
    graph = import_graph()
    cycle = find_cycle(graph)
    if cycle is not None:
        steps = [f"{a} imports {b} (line {graph[a][b]})" for a, b in zip(cycle, cycle[1:])]
        print("import cycle:", " -> ".join(cycle))
        raise AssertionError("import cycle: " + "; ".join(steps))
