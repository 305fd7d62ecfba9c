"""The package's layering (issue #14): no import cycle between modules of different folders, and no
module importing another module's private names. Reads the source with ast; imports nothing it checks."""
from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[2]
#: The folder of the repository that holds the replistream package (every module is under it).
PACKAGE_DIRS = {"replistream": "replistream"}


def _modules() -> dict[str, Path]:
    out = {}
    for folder, pkg in PACKAGE_DIRS.items():
        base = ROOT / folder
        for f in base.rglob("*.py"):
            rel = f.relative_to(base).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join([pkg, *parts])] = f
    return out


def _resolve(module: str, is_pkg: bool, level: int, name: str | None) -> str:
    if not level:
        return name or ""
    base = module.split(".") if is_pkg else module.split(".")[:-1]
    base = base[:len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def _imports(modules: dict[str, Path]):
    """(importer, imported module, imported names) for every import statement, at any depth."""
    for mod, path in modules.items():
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                for a in node.names:
                    yield mod, a.name, ()
            elif isinstance(node, ast.ImportFrom):
                yield mod, _resolve(mod, is_pkg, node.level, node.module), tuple(a.name for a in node.names)


def _owner(name: str, modules) -> str | None:
    """The module of ours that ``name`` (a dotted module path) is or is inside, or None."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> tuple[nx.DiGraph, dict[str, Path]]:
    """Our modules and who imports whom (at module level or inside functions alike)."""
    modules = _modules()
    g = nx.DiGraph()
    g.add_nodes_from(modules)
    for importer, target, names in _imports(modules):
        # "from pkg import mod" imports the submodule pkg.mod when there is one
        targets = [f"{target}.{n}" if f"{target}.{n}" in modules else target for n in names] or [target]
        for t in targets:
            owner = _owner(t, modules)
            if owner is not None and owner != importer:
                g.add_edge(importer, owner)
    return g, modules


def test_no_import_cycle_between_folders():
    g, modules = import_graph()
    bad = []
    for scc in nx.strongly_connected_components(g):
        if len({modules[m].parent for m in scc}) > 1:
            cycle = nx.find_cycle(g.subgraph(scc))
            bad.append(" -> ".join(a for a, _ in cycle) + f" -> {cycle[0][0]}")
    assert not bad, "import cycles across folders:\n" + "\n".join(bad)


def test_no_module_imports_another_modules_private_names():
    modules = _modules()
    bad = [f"{importer} imports {n} from {target}" for importer, target, names in _imports(modules)
           if _owner(target, modules) is not None for n in names if n.startswith("_") and not n.startswith("__")]
    assert not bad, "private names imported across modules:\n" + "\n".join(bad)


ENGINE = ROOT / "replistream" / "engines" / "ray"


def _class_lengths() -> dict[str, int]:
    out = {}
    for f in ENGINE.glob("*.py"):
        for node in ast.parse(f.read_text()).body:
            if isinstance(node, ast.ClassDef):
                out[f"{f.name}:{node.name}"] = node.end_lineno - node.lineno + 1
    return out


def test_the_users_handle_is_a_thin_client():
    """Issue #40, point 3: ``Deployment`` keeps no state of the run and stays under ~400 lines; no
    module of the engine reaches into a client (its ``_backend``) but the client itself, and the
    control plane is split by responsibility (none of its parts as large as the old ``Deployment``,
    1,740 lines, or the old ``ReplicaManager``, 926)."""
    client = ENGINE / "client.py"
    assert len(client.read_text().splitlines()) <= 400
    tree = ast.parse(client.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Deployment")
    init = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    assert len(init.body) == 1 and "_backend" in ast.unparse(init.body[0]), ast.unparse(init)  # its one field
    for f in ENGINE.glob("*.py"):
        if f.name != "client.py":
            assert "_backend" not in f.read_text(), f"{f.name} reaches into a client's backend"
    lengths = _class_lengths()
    for part in ["plane.py:ControlPlane", "monitor.py:Monitor", "repair.py:Repairer", "results.py:Results",
                 "faults.py:Faults", "ingest.py:Ingest", "changes.py:Changes", "coordlink.py:CoordinatorLink",
                 "control.py:ReplicaManager", "meter.py:Meter", "handover.py:HandOver"]:
        assert lengths[part] <= 500, (part, lengths[part])
