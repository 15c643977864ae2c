"""The house rules of the package layout (README, "Layout"): imports run one way, with no cycle
between modules (imports inside functions count), the core never imports anything above it,
leaves import nothing of the plugin, the one key table is what the docs list, and no function of
the engine or of a method takes more than eight parameters."""

import ast
import os
import re

from conftest import ROOT

PKG = os.path.join(ROOT, "dael_plugin")
# Each room may import only the rooms below it (and itself). Leaves import nothing of the plugin.
BELOW = {
    "core": set(),
    "about": set(),
    "errors": set(),
    "dassl_hook": set(),
    "transforms": {"errors"},
    "backbones": {"errors", "about"},
    "config": {"core", "errors", "transforms"},
    "data": {"core", "errors", "config", "transforms"},
    "engine": {"core", "errors", "about", "config", "data", "transforms", "backbones"},
    "methods": {"core", "errors", "about", "config", "data", "transforms", "backbones", "engine"},
    # the Dassl engine hosts the methods (dassl_adapter/method_trainer.py); no method imports Dassl's side
    "dassl_adapter": {"core", "errors", "about", "config", "data", "transforms", "backbones", "engine", "methods"},
    "tools": {
        "core",
        "errors",
        "about",
        "config",
        "data",
        "transforms",
        "backbones",
        "engine",
        "methods",
        "dassl_adapter",
        "__init__",
        "startup",
    },
    "__init__": {"about", "config", "errors", "dassl_adapter", "dassl_hook"},
}
BELOW["startup"] = set()  # a command's first import: the GC paused for torch's imports (a leaf)
BELOW["bench"] = BELOW["tools"]  # the benchmarks and GPU checks: beside tools, neither imports the other


def _modules():
    mods = {}
    for dirpath, _, files in os.walk(PKG):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(dirpath, f)
                name = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                mods[name[: -len(".__init__")] if name.endswith(".__init__") else name] = path
    return mods


def _imports(mods):
    """module -> the plugin modules it imports, anywhere in its body (functions included)."""
    edges = {}
    for name, path in mods.items():
        out = set()
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("dael_plugin"):
                assert node.level == 0, f"{path}: relative import"
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    out.add(full if full in mods else node.module)
            elif isinstance(node, ast.Import):
                out.update(a.name for a in node.names if a.name.startswith("dael_plugin"))
        edges[name] = {m for m in out if m in mods and m != name}
    return edges


def _room(module: str) -> str:
    parts = module.split(".")
    return "__init__" if len(parts) == 1 else parts[1]


def test_imports_run_one_way_with_no_cycle():
    mods = _modules()
    edges = _imports(mods)
    wrong = sorted(
        f"{m} -> {t}" for m, ts in edges.items() for t in ts if _room(t) != _room(m) and _room(t) not in BELOW[_room(m)]
    )
    assert not wrong, wrong
    # No cycle between modules: a depth-first search finds no back edge.
    state, cycle = {}, []

    def visit(m, path):
        state[m] = 1
        for t in sorted(edges[m]):
            if state.get(t) == 1:
                cycle.append(path + [t])
            elif t not in state:
                visit(t, path + [t])
        state[m] = 2

    for m in sorted(mods):
        if m not in state:
            visit(m, [m])
    assert not cycle, cycle[0]


def test_the_docs_list_every_key_of_the_table_with_its_default():
    import dataclasses

    from dael_plugin.config.table import DATASET_KEYS, KEYS, TOP_KEYS

    text = open(os.path.join(ROOT, "docs", "config_keys.md")).read()
    for key in KEYS + TOP_KEYS + tuple(dataclasses.replace(k, name=f"DATASET.{k.name}") for k in DATASET_KEYS):
        if key.dassl:
            continue  # Dassl's own three keys are described in the text above the table
        name = "TV_RANDAUGMENT_N" if key.name == "TV_RANDAUGMENT_M" else key.name
        row = next((ln for ln in text.splitlines() if ln.startswith(f"| `{name}`")), None)
        assert row is not None, f"docs/config_keys.md has no row for {key.name}"
        default = str(key.default) if not isinstance(key.default, str) else key.default
        assert re.search(rf"`{re.escape(default)}`|\b{re.escape(default)}\b", row), (key.name, key.default, row)


def test_the_commands_that_only_plan_launch_or_collect_start_without_torch():
    """``import dael_plugin`` and the sweep, collect, plots and lock modules leave torch and
    torchvision unimported (4 s of CPU per process start: a sweep, a collect, each submitit job's
    own process, each racer for a run's lock); ``add_dael_config`` still imports on first use."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "import dael_plugin, dael_plugin.tools.sweep, dael_plugin.tools.collect, dael_plugin.tools.plots\n"
        "import dael_plugin.tools.launchers, dael_plugin.engine.runlock\n"
        "heavy = sorted(m for m in ('torch', 'torchvision', 'timm', 'matplotlib') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
        "from dael_plugin import add_dael_config\n"
        "assert callable(add_dael_config) and 'torch' in sys.modules\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


LONG = 400  # lines


def test_a_long_module_says_why_it_is_long():
    """A module over about 400 lines is hard to read whole: each says in its docstring why it is
    one module ("Long because ..."), or is split. The check reads the docstring, not the code."""
    unexplained = []
    for name, path in sorted(_modules().items()):
        text = open(path).read()
        n = text.count("\n")
        if n <= LONG:
            continue
        doc = ast.get_docstring(ast.parse(text)) or ""
        if "Long because" not in doc:
            unexplained.append(f"{name} ({n} lines)")
    assert not unexplained, "over 400 lines without a 'Long because' sentence: " + ", ".join(unexplained)


MOST_PARAMETERS = 8  # a function's, self and cls not counted; *args and **kwargs count one each
NARROW_ROOMS = ("engine", "methods")  # the loop and the methods it hosts


def _parameters(fn) -> int:
    a = fn.args
    names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
    if names and names[0] in ("self", "cls"):
        names = names[1:]
    return len(names) + (a.vararg is not None) + (a.kwarg is not None)


def test_no_function_of_the_loop_or_a_method_takes_more_than_eight_parameters():
    """What a function of the engine or of a method needs comes as a few objects with names (a run's identity,
    its strategy, its scoring), not as a long list of loose values and closures."""
    wide = []
    for name, path in sorted(_modules().items()):
        if _room(name) not in NARROW_ROOMS:
            continue
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _parameters(node) > MOST_PARAMETERS:
                wide.append(f"{name}.{node.name} ({_parameters(node)})")
    assert not wide, f"over {MOST_PARAMETERS} parameters: " + ", ".join(wide)


def test_dassls_private_registry_state_is_touched_in_one_module():
    """Dassl's registries are used through their public ``register``/``get``; the one exception,
    the lazy ``timm_<model>`` names, lives in dassl_adapter/timm_names.py, which says why."""
    touched = []
    for name, path in sorted(_modules().items()):
        text = open(path).read()
        if name != "dael_plugin.dassl_adapter.timm_names" and ("._do_register(" in text or "._obj_map" in text):
            touched.append(name)
    assert not touched, touched


def test_the_commands_read_a_trainer_through_its_facts_not_by_probing_it():
    """What the commands and the records read of a trainer is written in one class with defaults
    (engine/results.TrainerFacts), which every trainer of both engines has; ``getattr`` /
    ``hasattr`` on a trainer would hide a missing attribute behind a default that looks right.
    The one reader of Dassl's own modules by name is dassl_adapter/records.baseline_encoder."""
    probes = []
    for name, path in sorted(_modules().items()):
        tree = ast.parse(open(path).read())
        allowed = set()
        for fn in ast.walk(tree):
            if isinstance(fn, ast.FunctionDef) and fn.name == "baseline_encoder":
                allowed |= {id(n) for n in ast.walk(fn)}
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr")
                and node.args
                and isinstance(node.args[0], ast.Name)
                and node.args[0].id in ("trainer", "tr")
                and id(node) not in allowed
            ):
                probes.append(f"{name}:{node.lineno}")
    assert not probes, "a trainer probed instead of read: " + ", ".join(probes)
