"""AST guards that keep the config design true, each pinned at zero.

1. No assignment to a ServerArgs instance outside the resolution code.
2. No `get_server_args().field` read, direct or through an alias, outside the
   config layer (exempt by name, with a reason each).
3. Every field in exactly one namespace; no name both a leaf and a sub-namespace.
4. Every process entry (`run_*_process`) publishes under a role listed in
   ROLE_NAMESPACE_SETS, directly or through a helper that forwards its `role`.
5. Tests never monkeypatch a config getter: they publish a config instead.

Each guard has a test that plants a violation in a snippet and sees it caught.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from sglang.srt.arg_groups.arg_utils import arg, derived_of, namespace_of
from sglang.srt.runtime_context import BAG_RESERVED, ROLE_NAMESPACE_SETS, TOP_NAMESPACES
from sglang.srt.server_args import FIELD_NAMES, ServerArgs

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "python" / "sglang"
TEST_DIRS = (REPO / "test", PACKAGE / "test")

# Getters a test must never patch (publish with override_server_args instead).
CONFIG_GETTERS = frozenset(
    {"get_server_args", "config_bag", "get_parallel", "get_context"}
    | {f"get_{ns}" for ns in TOP_NAMESPACES}
)

# The config layer itself may write and read the record.
CONFIG_LAYER = ("srt/server_args.py", "srt/runtime_context.py", "srt/arg_groups/")

# ServerArgs members that are the derived API, not field reads.
DERIVED_API = frozenset({"resolved_dict", "derive", "resolve_once", "is_resolved"})

# (module path relative to python/sglang, function name) -> why it may read the record.
EXEMPT_READS: dict[tuple[str, str], str] = {}

ENTRY_NAME = re.compile(r"^run_\w+_process$")


@functools.cache
def package_sources() -> list[tuple[str, str]]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        out.append((rel, path.read_text(encoding="utf-8")))
    return out


def in_config_layer(rel: str) -> bool:
    return any(rel == p or (p.endswith("/") and rel.startswith(p)) for p in CONFIG_LAYER)


# ---- guard 1: writers ----------------------------------------------------------


def _is_get_server_args_call(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
    return name == "get_server_args"


def _looks_like_server_args(node: ast.AST) -> bool:
    if isinstance(node, ast.Name):
        return node.id == "sa" or node.id.endswith("server_args")
    if isinstance(node, ast.Attribute):
        return node.attr.endswith("server_args")
    return _is_get_server_args_call(node)


def _assigned_targets(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, ast.Assign):
        return [t for target in node.targets for t in ast.walk(target)]
    if isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        return [node.target]
    return []


def _setattr_target(node: ast.AST) -> tuple[ast.AST, str] | None:
    if not isinstance(node, ast.Call) or len(node.args) < 2:
        return None
    func = node.func
    is_setattr = (isinstance(func, ast.Name) and func.id == "setattr") or (
        isinstance(func, ast.Attribute) and func.attr == "__setattr__"
    )
    name = node.args[1]
    if is_setattr and isinstance(name, ast.Constant) and name.value in FIELD_NAMES:
        return node.args[0], name.value
    return None


def find_writes(source: str | ast.Module, rel: str) -> list[str]:
    found = []
    tree = ast.parse(source) if isinstance(source, str) else source
    for node in ast.walk(tree):
        for target in _assigned_targets(node):
            if (
                isinstance(target, ast.Attribute)
                and target.attr in FIELD_NAMES
                and _looks_like_server_args(target.value)
            ):
                found.append(f"{rel}:{target.lineno} assigns .{target.attr}")
        hit = _setattr_target(node)
        if hit and _looks_like_server_args(hit[0]):
            found.append(f"{rel}:{node.lineno} setattr {hit[1]}")
    return found


# ---- guard 2: readers ----------------------------------------------------------


def _functions(tree: ast.Module) -> list[ast.AST]:
    funcs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return [tree, *funcs]


def _scope_nodes(scope: ast.AST) -> list[ast.AST]:
    """Nodes of one scope, not descending into nested functions (their own scopes)."""
    out, stack = [], list(ast.iter_child_nodes(scope))
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        out.append(node)
        stack.extend(ast.iter_child_nodes(node))
    return out


def _aliases(nodes: list[ast.AST]) -> set[str]:
    names = set()
    for node in nodes:
        if isinstance(node, ast.Assign) and _is_get_server_args_call(node.value):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


def find_reads(source: str | ast.Module, rel: str) -> list[str]:
    found = set()
    tree = ast.parse(source) if isinstance(source, str) else source
    for scope in _functions(tree):
        name = getattr(scope, "name", "<module>")
        if (rel, name) in EXEMPT_READS:
            continue
        nodes = _scope_nodes(scope)
        aliases = _aliases(nodes)
        for node in nodes:
            if not isinstance(node, ast.Attribute) or node.attr in DERIVED_API:
                continue
            direct = _is_get_server_args_call(node.value)
            alias = isinstance(node.value, ast.Name) and node.value.id in aliases
            if direct or (alias and node.attr in FIELD_NAMES):
                found.add(f"{rel}:{node.lineno} {name} reads get_server_args().{node.attr}")
    return sorted(found)


# ---- guard 3: namespaces -------------------------------------------------------


def namespace_violations(cls: type) -> list[str]:
    try:
        leaves = namespace_of(cls)
        derived = {name: path for name, (path, _) in derived_of(cls).items()}
    except TypeError as exc:
        return [str(exc)]
    problems = []
    all_leaves = {**leaves, **derived}
    for name, path in all_leaves.items():
        if path.split(".")[0] not in TOP_NAMESPACES:
            problems.append(f"{name}: namespace {path!r} is not a top-level namespace")
        if name in BAG_RESERVED:
            problems.append(f"{name}: reserved bag attribute")
    overlap = set(leaves) & set(derived)
    problems += [f"{name}: both a field and a Derived" for name in sorted(overlap)]
    for path in set(all_leaves.values()):
        parts = path.split(".")
        for i in range(1, len(parts)):
            parent, child = ".".join(parts[:i]), parts[i]
            if all_leaves.get(child) == parent:
                problems.append(f"'{parent}.{child}' is both a leaf and a sub-namespace")
    return sorted(set(problems))


# ---- guard 4: process entries --------------------------------------------------


def _call_name(node: ast.Call) -> str | None:
    func = node.func
    return func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)


def _role_arg(call: ast.Call, index: int | None, keyword: str) -> ast.AST | None:
    for kw in call.keywords:
        if kw.arg == keyword:
            return kw.value
    if index is not None and index < len(call.args):
        return call.args[index]
    return None


def publishing_helpers(trees: list[ast.Module]) -> dict[str, tuple[int, str]]:
    """Functions that call publish(role=<their own parameter>): name -> (index, param)."""
    helpers = {}
    for tree in trees:
        for func in ast.walk(tree):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            params = [a.arg for a in func.args.posonlyargs + func.args.args]
            params += [a.arg for a in func.args.kwonlyargs]
            for call in ast.walk(func):
                if isinstance(call, ast.Call) and _call_name(call) == "publish":
                    role = _role_arg(call, None, "role")
                    if isinstance(role, ast.Name) and role.id in params:
                        idx = params.index(role.id)
                        helpers[func.name] = (idx if idx < len(func.args.args) else None, role.id)
    return helpers


def _published_role(call: ast.Call, helpers: dict[str, tuple[int, str]]) -> object:
    name = _call_name(call)
    if name == "publish":
        role = _role_arg(call, None, "role")
    elif name in helpers:
        role = _role_arg(call, *helpers[name])
    else:
        return None
    return role.value if isinstance(role, ast.Constant) else "<not a constant>"


def find_unlisted_publishes(trees: dict[str, ast.Module]) -> list[str]:
    """Any publish(role="<constant>") call anywhere must name a listed role."""
    return [
        f"{rel}:{call.lineno} publishes role {role.value!r}, not in ROLE_NAMESPACE_SETS"
        for rel, tree in trees.items()
        for call in ast.walk(tree)
        if isinstance(call, ast.Call) and _call_name(call) == "publish"
        for role in [_role_arg(call, None, "role")]
        if isinstance(role, ast.Constant) and role.value not in ROLE_NAMESPACE_SETS
    ]


def find_entry_violations(trees: dict[str, ast.Module]) -> list[str]:
    helpers = publishing_helpers(list(trees.values()))
    found = []
    for rel, tree in trees.items():
        for func in ast.walk(tree):
            if not isinstance(func, ast.FunctionDef) or not ENTRY_NAME.match(func.name):
                continue
            roles = [
                _published_role(call, helpers)
                for call in ast.walk(func)
                if isinstance(call, ast.Call)
            ]
            roles = [r for r in roles if r is not None]
            if not roles:
                found.append(f"{rel}:{func.lineno} {func.name} never calls publish(role=...)")
            found += [
                f"{rel}:{func.lineno} {func.name} publishes role {r!r}, not in ROLE_NAMESPACE_SETS"
                for r in roles
                if r not in ROLE_NAMESPACE_SETS
            ]
    return found


@functools.cache
def parse_package() -> dict[str, ast.Module]:
    return {rel: ast.parse(src) for rel, src in package_sources()}


# ---- guard 5: no patched getters in tests --------------------------------------

PATCHERS = frozenset({"setattr", "patch", "object", "setitem"})


def _names_a_getter(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.rsplit(".", 1)[-1] in CONFIG_GETTERS
    return isinstance(node, ast.Attribute) and node.attr in CONFIG_GETTERS


def find_patched_getters(source: str, rel: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and _call_name(node) in PATCHERS:
            if any(_names_a_getter(a) for a in node.args[:2]):
                found.append(f"{rel}:{node.lineno} patches a config getter")
    return found


def tree_test_sources() -> list[tuple[str, str]]:
    paths = sorted({p for d in TEST_DIRS if d.is_dir() for p in d.rglob("*.py")})
    return [(p.relative_to(REPO).as_posix(), p.read_text(encoding="utf-8")) for p in paths]


# ---- the guards, pinned at zero ------------------------------------------------


def test_no_server_args_writes_outside_resolution():
    found = [v for rel, tree in parse_package().items() if not in_config_layer(rel)
             for v in find_writes(tree, rel)]  # fmt: skip
    assert found == []


def test_no_get_server_args_field_reads():
    found = [v for rel, tree in parse_package().items() if not in_config_layer(rel)
             for v in find_reads(tree, rel)]  # fmt: skip
    assert found == []


def test_every_field_has_exactly_one_namespace():
    assert namespace_violations(ServerArgs) == []
    assert set(namespace_of(ServerArgs)) == {f.name for f in dataclasses.fields(ServerArgs)}


def test_every_process_entry_publishes_a_listed_role():
    assert find_entry_violations(parse_package()) == []
    assert find_unlisted_publishes(parse_package()) == []


def test_no_test_patches_a_config_getter():
    found = [v for rel, src in tree_test_sources() if rel != "test/unit/test_guards.py"
             for v in find_patched_getters(src, rel)]  # fmt: skip
    assert found == []


# ---- each guard catches a planted violation ------------------------------------


def snippet(code: str) -> str:
    return textwrap.dedent(code)


def test_writer_guard_catches_planted_writes():
    code = snippet(
        """
        def f(server_args, self):
            server_args.tp_size = 2
            self.server_args.port += 1
            setattr(server_args, "page_size", 4)
            object.__setattr__(sa, "dtype", "float16")
            get_server_args().host = "x"
            server_args.not_a_field = 1
            args.tp_size = 3
        """
    )
    found = find_writes(code, "planted.py")
    assert len(found) == 5, found


def test_reader_guard_catches_direct_and_alias_reads():
    code = snippet(
        """
        def f():
            a = get_server_args().tp_size
            sa = get_server_args()
            b = sa.page_size
            c = sa.resolved_dict()
            d = rc.get_server_args().derive("x", port=1)
            return a, b, c, d
        """
    )
    found = find_reads(code, "planted.py")
    assert len(found) == 2, found
    EXEMPT_READS[("planted.py", "f")] = "planted exemption"
    try:
        assert find_reads(code, "planted.py") == []
    finally:
        del EXEMPT_READS[("planted.py", "f")]


def test_namespace_guard_catches_missing_and_colliding_namespaces():
    @dataclass(kw_only=True)
    class NoNamespace:
        orphan: int = arg(0, "a field without a namespace")

    @dataclass(kw_only=True)
    class ExecLeafNamedKernel:
        _NS_PATH = "exec"
        kernel: int = arg(0, "collides with the exec.kernel sub-namespace")

    @dataclass(kw_only=True)
    class Kernel:
        _NS_PATH = "exec.kernel"
        attention_backend: str = arg("x", "a leaf")

    @dataclass(kw_only=True)
    class Bad(Kernel, ExecLeafNamedKernel):
        pass

    @dataclass(kw_only=True)
    class Orphaned(Kernel, NoNamespace):
        pass

    assert namespace_violations(Orphaned) and "orphan" in namespace_violations(Orphaned)[0]
    assert namespace_violations(Bad) == ["'exec.kernel' is both a leaf and a sub-namespace"]


def test_entry_guard_catches_missing_and_unlisted_publish():
    code = snippet(
        """
        def run_scheduler_process(server_args):
            build(server_args)

        def run_detokenizer_process(server_args):
            publish(server_args, role="detok")

        def run_tokenizer_process(server_args):
            publish(server_args, role="tokenizer")

        def run_child(role, server_args):
            publish(server_args, role=role)

        def run_dp_controller_process(server_args):
            run_child("dp_controller", server_args)

        def run_other_process(server_args):
            run_child(role="nobody", server_args=server_args)
        """
    )
    found = find_entry_violations({"planted.py": ast.parse(code)})
    assert len(found) == 3, found
    assert len(find_unlisted_publishes({"planted.py": ast.parse(code)})) == 1
    assert any("run_scheduler_process never calls publish" in v for v in found)
    assert any("'detok'" in v for v in found)
    assert any("'nobody'" in v for v in found)


def test_patch_guard_catches_planted_patches():
    code = snippet(
        """
        def test_x(monkeypatch):
            monkeypatch.setattr(rc, "get_server_args", lambda: fake)
            monkeypatch.setattr("sglang.srt.runtime_context.get_exec", lambda: fake)
            with mock.patch.object(rc, "get_parallel"):
                pass
            monkeypatch.setattr(demo, "demo_target_path", lambda: None)
        """
    )
    assert len(find_patched_getters(code, "planted.py")) == 3


@pytest.mark.parametrize("role", sorted(ROLE_NAMESPACE_SETS))
def test_roles_use_known_namespaces(role):
    allowed = ROLE_NAMESPACE_SETS[role]
    assert allowed is None or allowed <= set(TOP_NAMESPACES)
