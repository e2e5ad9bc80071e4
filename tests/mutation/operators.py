"""The mutants: small edits to the deciding code of the invariant checks and the capture checks.

Each mutant is one edit of one module's syntax tree, inside a function (module-level constants
and the invariants' doc texts are never mutated). The operators (docs/mutation-score.md):

- `never-fail`   an `if`/`elif` test that guards a failure becomes `False` (the branch can never
                 fail); `True` where the failure sits in the `else`. A guard is a test whose
                 branch appends to or extends a findings list (`problems`, `failures`,
                 `findings`, `found`, `out`, `bad*`, `unnamed`, `unobserved`, `hits`,
                 `incomplete`, `missing`), returns `failed*(...)`/`undecided(...)`, a failure
                 record (`{"kind": ...}`) or a problem string (in a `*problem*` function),
                 raises (`Missing`, `UsageError`), or skips a candidate (`continue`).
- `negate-if`    every `if`/`elif` test negated.
- `negate-bool`  each operand of an `and`/`or` chain negated; in a guard's test an operand of
                 `or` also becomes `False` (that one reason can no longer fail).
- `never-filter` a comprehension filter that selects findings becomes `False`.
- `cmp-flip`     `==`/`!=`, `<`/`<=`, `>`/`>=`, `in`/`not in`, `is`/`is not`, one operator at a
                 time.
- `off-by-one`   an integer constant inside a comparison +1 and -1; `x + k` / `x - k` (k an
                 integer constant) anywhere in a function becomes `x` (`sh2 + 1` -> `sh2`).
- `drop-finding` a `problems.append(...)`/`problems += ...` statement on a findings list
                 becomes `pass`.
- `fail-passes`  `return failed(...)`/`failed_with(...)`/`undecided(...)` becomes
                 `return passed(...)` with the same arguments.

Numbering is deterministic: the targets in TARGETS order, then the nodes in source order, then
the operators in the order above. Two edits that give the same tree are one mutant.
"""

from __future__ import annotations

import ast
import copy
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# (path relative to the repository root, the module it installs as)
TARGETS: tuple[tuple[str, str], ...] = tuple(
    [
        (f"invariants/{p.name}", f"egf_audit.invariants.{p.stem}")
        for p in sorted((ROOT / "invariants").glob("*.py"))
        if p.name != "__init__.py"
    ]
    + [("invariants/__init__.py", "egf_audit.invariants")]
    + [
        (f"auditor/capture/{n}.py", f"egf_audit.capture.{n}")
        for n in ("layout", "inference", "convert")
    ]
    # what a capture observed a launch do, queried on the trace model (auditor/trace/)
    + [(f"auditor/trace/{n}.py", f"egf_audit.trace.{n}") for n in ("observed", "evidence")]
    # run --capture's orchestration (every invariant over every process), and what a capture
    # observed a launch do, moved out of invariants/ and auditor/capture/ by the house work
    + [("auditor/cli/capture_audit.py", "egf_audit.cli.capture_audit")]
)
# Functions whose result is only text or evidence (a verdict's summary, its evidence dict, a
# finding's words, the report): no status depends on them, so they are not mutated. Each was
# read to check that no caller decides anything from what it returns.
MESSAGE_ONLY: dict[str, frozenset[str]] = {
    "invariants/capture_common.py": frozenset({"where", "named", "site_name"}),
    "invariants/capture_roles.py": frozenset({"_named", "_Roles._wrong_tensor"}),
    "invariants/gemm_spans.py": frozenset({"_slice_index", "_rows_words"}),
    "invariants/common.py": frozenset(
        {
            "describe",
            "json_float",
            "hex_bits",
            "first_index",
            "listed",
            "count_by",
            "tensor_of_element",
        }
    ),
    "invariants/egf001_gemm_k_matches_lda.py": frozenset(
        {"_operand_facts", "_launch_facts", "names_offenders"}
    ),
    "invariants/egf003_wire_zero_under_sentinel.py": frozenset({"_injected_kinds"}),
    "invariants/egf008_both_call_sites_gated.py": frozenset({"_scale_facts", "_words"}),
    "invariants/egf010_oracle_agreement.py": frozenset({"_failing", "_step_evidence"}),
    "invariants/egf013_kernel_effects_contained.py": frozenset({"_what"}),
    "invariants/registry.py": frozenset({"Invariant.doc"}),
    "auditor/cli/capture_audit.py": frozenset({"ProcessAudit.unresolved_gemms"}),
    # a byte address in words, for EGF013's finding (read: no caller decides from it)
    "auditor/trace/observed.py": frozenset({"where"}),
}
# Calls whose arguments are only words or evidence: a verdict's constructor (its status is the
# function called, never an argument), an exception's message.
WORDS_CALLS = {
    "passed",
    "failed",
    "failed_with",
    "failed_at_sites",
    "warned",
    "undecided",
    "Missing",
    "UsageError",
    "_refuse",
}
EVIDENCE = {"evidence", "counts"}  # the names the checks give a verdict's evidence dict
CAPTURE_MODULES = {
    "egf_audit.capture.layout",
    "egf_audit.capture.inference",  # names a capture without a layout file: the whole audit
    "egf_audit.capture.convert",
    "egf_audit.cli.capture_audit",
}

FINDINGS = re.compile(
    r"^(problems|failures|findings|found|out|bad\w*|unnamed|unobserved|hits|incomplete|missing)$"
)
FAILING_CALLS = {"failed", "failed_with", "failed_at_sites", "undecided"}
RAISING_CALLS = {"_refuse"}
FLIPS: dict[type, type] = {
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
}
SYMBOL = {
    ast.Eq: "==",
    ast.NotEq: "!=",
    ast.Lt: "<",
    ast.LtE: "<=",
    ast.Gt: ">",
    ast.GtE: ">=",
    ast.In: "in",
    ast.NotIn: "not in",
    ast.Is: "is",
    ast.IsNot: "is not",
}


@dataclass(frozen=True)
class Mutant:
    id: str  # "M0001"
    file: str  # relative to the repository root
    module: str  # the module it installs as
    line: int
    function: str  # the innermost function (Class.method)
    operator: str
    description: str  # one line
    path: tuple[tuple[str, int | None], ...]  # where the node sits in the module's tree
    guard: bool  # the edited code decides a failure directly (a guard or a failing statement)

    def tree(self, source_tree: ast.Module) -> ast.Module:
        """The module's tree with this mutant's edit applied (the given tree is not changed)."""
        tree = copy.deepcopy(source_tree)
        parent, field, index = _locate(tree, self.path)
        old = getattr(parent, field) if index is None else getattr(parent, field)[index]
        new = _apply(old, self.operator, self.description)
        if index is None:
            setattr(parent, field, new)
        else:
            getattr(parent, field)[index] = new
        return ast.fix_missing_locations(tree)


def _locate(tree: ast.AST, path):
    node = tree
    for field, index in path[:-1]:
        node = getattr(node, field) if index is None else getattr(node, field)[index]
    field, index = path[-1]
    return node, field, index


# ---- what a failure looks like ----
def _terminal_name(node: ast.AST) -> str | None:
    """`problems` for problems, self.problems, found["problems"]."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        return str(node.slice.value)
    return None


def is_finding_statement(stmt: ast.stmt) -> bool:
    """`problems.append(...)`, `problems.extend(...)`, `problems += ...` on a findings list."""
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        func = stmt.value.func
        if isinstance(func, ast.Attribute) and func.attr in ("append", "extend"):
            return bool(FINDINGS.match(_terminal_name(func.value) or ""))
    if isinstance(stmt, ast.AugAssign) and isinstance(stmt.op, ast.Add):
        return bool(FINDINGS.match(_terminal_name(stmt.target) or ""))
    return False


def _call_name(node: ast.AST | None) -> str | None:
    if isinstance(node, ast.Call):
        return _terminal_name(node.func)
    return None


def _failure_value(value: ast.AST | None, function: str) -> bool:
    """A returned value that is a failure: failed*(...)/undecided(...), a failure record, a
    (record, label) pair, or a problem string from a function that names problems."""
    if value is None:
        return False
    if _call_name(value) in FAILING_CALLS:
        return True
    if isinstance(value, ast.Tuple) and value.elts:
        return _failure_value(value.elts[0], function)
    if isinstance(value, ast.Dict):
        return any(isinstance(k, ast.Constant) and k.value == "kind" for k in value.keys)
    if "problem" in function and isinstance(value, ast.JoinedStr | ast.Constant):
        return not (isinstance(value, ast.Constant) and value.value in (None, ""))
    return False


def fails(stmts: list[ast.stmt], function: str) -> bool:
    """The statements (not entering nested functions) record or return a failure, or skip."""
    for stmt in stmts:
        for node in _walk_statements(stmt):
            if is_finding_statement(node):
                return True
            if isinstance(node, ast.Return) and _failure_value(node.value, function):
                return True
            if isinstance(node, ast.Raise):
                return True
            if isinstance(node, ast.Expr) and _call_name(node.value) in RAISING_CALLS:
                return True
    return False


def _skips(stmts: list[ast.stmt]) -> bool:
    return len(stmts) == 1 and isinstance(stmts[0], ast.Continue)


def _walk_statements(stmt: ast.stmt):
    yield stmt
    for field in ("body", "orelse", "finalbody", "handlers"):
        for child in getattr(stmt, field, []) or []:
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                continue
            yield from _walk_statements(child)


# ---- the edits ----
def _negated(node: ast.expr) -> ast.expr:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return node.operand
    return ast.UnaryOp(ast.Not(), node)


def _apply(old: ast.AST, operator: str, description: str) -> ast.AST:
    new = copy.deepcopy(old)
    if operator in ("negate-if", "negate-bool"):
        return _negated(new)
    if operator in ("never-fail", "never-filter", "never-reason"):
        return ast.Constant(value="-> True" in description)
    if operator == "cmp-flip":
        index = int(description.split("#", 1)[1].split(":", 1)[0])
        new.ops[index] = FLIPS[type(new.ops[index])]()
        return new
    if operator == "off-by-one":
        if isinstance(new, ast.BinOp):
            return new.left if isinstance(new.right, ast.Constant) else new.right
        new.value = new.value + (1 if "+1" in description.split(":", 1)[0] else -1)
        return new
    if operator == "drop-finding":
        return ast.Pass()
    if operator == "fail-passes":
        new.value.func = ast.Name("passed", ast.Load())
        return new
    raise ValueError(operator)


def _int_constant(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) is int


class _Collector(ast.NodeVisitor):
    """Walks a module's tree, keeping the path to every node, and lists the candidate edits."""

    def __init__(self, file: str, module: str, source: str):
        self.file, self.module, self.source = file, module, source
        self.path: list[tuple[str, int | None]] = []
        self.functions: list[str] = []
        self.classes: list[str] = []
        self.found: list[tuple] = []  # (line, col, order, operator, description, path, guard)
        self.order = 0
        self.guard_tests: set[int] = set()  # id() of tests that guard a failure
        self.finding_comprehensions: set[int] = set()

    # traversal with paths
    def generic_visit(self, node: ast.AST) -> None:
        for field, value in ast.iter_fields(node):
            if isinstance(value, list):
                for i, item in enumerate(value):
                    if isinstance(item, ast.AST):
                        self.path.append((field, i))
                        self.visit(item)
                        self.path.pop()
            elif isinstance(value, ast.AST):
                self.path.append((field, None))
                self.visit(value)
                self.path.pop()

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.classes.append(node.name)
        self.generic_visit(node)
        self.classes.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        name = ".".join([*self.classes[-1:], node.name]) if not self.functions else node.name
        if not self.functions and name in MESSAGE_ONLY.get(self.file, ()):
            return  # its result is only words or evidence
        self.functions.append(name)
        # decorators and defaults are not the function's deciding code
        for i, stmt in enumerate(node.body):
            self.path.append(("body", i))
            self.visit(stmt)
            self.path.pop()
        self.functions.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    @property
    def function(self) -> str:
        return self.functions[-1] if self.functions else ""

    def add(self, node: ast.AST, operator: str, description: str, guard: bool, path=None) -> None:
        self.order += 1
        where = tuple(path if path is not None else self.path)
        self.found.append(
            (node.lineno, node.col_offset, self.order, operator, description, where, guard)
        )

    def text(self, node: ast.AST) -> str:
        text = ast.unparse(node)
        return text if len(text) <= 70 else text[:67] + "..."

    # words and evidence: never mutated
    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        pass

    def visit_Call(self, node: ast.Call) -> None:
        if _call_name(node) in WORDS_CALLS:
            self.path.append(("func", None))
            self.visit(node.func)
            self.path.pop()
            return
        func = node.func
        appends = isinstance(func, ast.Attribute) and func.attr == "append"
        if appends and FINDINGS.match(_terminal_name(func.value) or ""):
            return  # a finding's record or words
        self.generic_visit(node)

    def visit_Raise(self, node: ast.Raise) -> None:
        pass

    # the operators
    def visit_If(self, node: ast.If) -> None:
        if self.functions:
            body, orelse = fails(node.body, self.function), fails(node.orelse, self.function)
            test_path = [*self.path, ("test", None)]
            shown = self.text(node.test)
            if not _plain_equality(node.test):  # its cmp-flip is the negation
                self.add(
                    node, "negate-if", f"if {shown} -> if not ({shown})", body or orelse, test_path
                )
            if (body and not orelse) or _skips(node.body):
                self.add(node, "never-fail", f"if {shown} -> False", True, test_path)
            elif orelse and not body:
                self.add(node, "never-fail", f"if {shown} -> True", True, test_path)
            if body or orelse:
                self.guard_tests.add(id(node.test))
                self._mark_or_operands(node.test, body and not orelse)
        self.generic_visit(node)

    def _mark_or_operands(self, test: ast.expr, never_false: bool) -> None:
        if isinstance(test, ast.BoolOp):
            for value in test.values:
                self.guard_tests.add(id(value))
        if never_false and isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or):
            self._or_guard = getattr(self, "_or_guard", set()) | {id(test)}

    def visit_BoolOp(self, node: ast.BoolOp) -> None:
        if self.functions:
            kind = "and" if isinstance(node.op, ast.And) else "or"
            guard = id(node) in self.guard_tests
            for i, value in enumerate(node.values):
                path = [*self.path, ("values", i)]
                shown = self.text(value)
                if not _plain_equality(value):  # its cmp-flip is the negation
                    self.add(
                        value, "negate-bool", f"{kind} operand {shown} -> not (...)", guard, path
                    )
                if id(node) in getattr(self, "_or_guard", set()):
                    self.add(value, "never-reason", f"or operand {shown} -> False", True, path)
        self.generic_visit(node)

    def _visit_comprehension_owner(self, node: ast.AST) -> None:
        if self.functions and id(node) in self.finding_comprehensions:
            for g, gen in enumerate(node.generators):
                for i, cond in enumerate(gen.ifs):
                    path = [*self.path, ("generators", g), ("ifs", i)]
                    shown = self.text(cond)
                    self.add(cond, "never-filter", f"findings filter {shown} -> False", True, path)
        self.generic_visit(node)

    visit_ListComp = _visit_comprehension_owner
    visit_GeneratorExp = _visit_comprehension_owner
    visit_SetComp = _visit_comprehension_owner

    def _mark_findings(self, value: ast.AST | None) -> None:
        for node in ast.walk(value) if value is not None else ():
            if isinstance(node, ast.ListComp | ast.GeneratorExp | ast.SetComp):
                self.finding_comprehensions.add(id(node))

    def visit_Return(self, node: ast.Return) -> None:
        if self.functions:
            if re.search(r"problem|failure|finding", self.function):
                self._mark_findings(node.value)
            if _call_name(node.value) in {"failed", "failed_with", "undecided"}:
                call = _call_name(node.value)
                self.add(node, "fail-passes", f"return {call}(...) -> return passed(...)", True)
        self.generic_visit(node)

    def visit_Expr(self, node: ast.Expr) -> None:
        if self.functions and is_finding_statement(node):
            self._mark_findings(node.value)
            self.add(node, "drop-finding", f"{self.text(node)} -> pass", True)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        if self.functions and is_finding_statement(node):
            self._mark_findings(node.value)
            self.add(node, "drop-finding", f"{self.text(node)} -> pass", True)
        self.generic_visit(node)

    def visit_Assign(self, node: ast.Assign) -> None:
        names = [_terminal_name(t) or "" for t in node.targets]
        evidence = [t.id if isinstance(t, ast.Name) else "" for t in node.targets]
        evidence += [
            t.value.id
            for t in node.targets
            if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name)
        ]
        if self.functions and EVIDENCE & set(evidence):
            return  # a verdict's evidence: words and numbers, no status
        if self.functions and any(FINDINGS.match(n) for n in names):
            self._mark_findings(node.value)
        self.generic_visit(node)

    def visit_Compare(self, node: ast.Compare) -> None:
        if self.functions:
            shown = self.text(node)
            guard = id(node) in self.guard_tests
            for i, op in enumerate(node.ops):
                flipped = SYMBOL[FLIPS[type(op)]]
                self.add(
                    node, "cmp-flip", f"#{i}: {SYMBOL[type(op)]} -> {flipped} in {shown}", guard
                )
            for sub_path, sub in _int_constants(node):
                for delta in ("+1", "-1"):
                    self.add(
                        sub,
                        "off-by-one",
                        f"{delta}: {sub.value} -> {sub.value + int(delta)} in {shown}",
                        guard,
                        [*self.path, *sub_path],
                    )
        self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        if self.functions and isinstance(node.op, ast.Add | ast.Sub):
            left, right = _int_constant(node.left), _int_constant(node.right)
            if (right and not left) or (left and not right and isinstance(node.op, ast.Add)):
                kept = node.right if left else node.left
                self.add(
                    node,
                    "off-by-one",
                    f"drop: {self.text(node)} -> {self.text(kept)}",
                    False,
                )
        self.generic_visit(node)


def _plain_equality(node: ast.AST) -> bool:
    """A single `==`, `!=`, `in`, `not in`, `is` or `is not`: flipping it negates it."""
    negating = (ast.Eq, ast.NotEq, ast.In, ast.NotIn, ast.Is, ast.IsNot)
    return (
        isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], negating)
    )


def _int_constants(node: ast.Compare):
    """(path inside the comparison, node) of every integer constant in it, not entering
    nested comparisons (they get their own) or lambdas."""

    def walk(n: ast.AST, path):
        for field, value in ast.iter_fields(n):
            items = (
                [(i, v) for i, v in enumerate(value)]
                if isinstance(value, list)
                else [(None, value)]
            )
            for i, v in items:
                if not isinstance(v, ast.AST) or isinstance(v, ast.Compare | ast.Lambda):
                    continue
                here = [*path, (field, i)]
                if _int_constant(v):
                    yield here, v
                else:
                    yield from walk(v, here)

    yield from walk(node, [])


def mutants_of(file: str, module: str, start: int = 1) -> list[Mutant]:
    source = (ROOT / file).read_text(encoding="utf-8")
    tree = ast.parse(source, filename=file)
    collector = _Collector(file, module, source)
    # a first pass marks the findings comprehensions and guard tests the second pass edits
    collector.visit(tree)
    marks = (collector.guard_tests, collector.finding_comprehensions)
    or_guards = getattr(collector, "_or_guard", set())
    collector = _Collector(file, module, source)
    collector.guard_tests, collector.finding_comprehensions = marks
    collector._or_guard = or_guards
    collector.visit(tree)
    out: list[Mutant] = []
    seen: set[tuple] = set()
    for line, _col, _order, operator, description, path, guard in sorted(collector.found):
        # two edits that leave the same node are one mutant (e.g. negating `not x` twice)
        key = (path, ast.dump(_apply(_node_at(tree, path), operator, description)))
        if key in seen:
            continue
        seen.add(key)
        function = _function_at(tree, path)
        out.append(
            Mutant(
                f"M{start + len(out):04d}",
                file,
                module,
                line,
                function,
                operator,
                description,
                path,
                guard,
            )
        )
    return out


def _node_at(tree: ast.AST, path) -> ast.AST:
    parent, field, index = _locate(tree, path)
    return getattr(parent, field) if index is None else getattr(parent, field)[index]


def _function_at(tree: ast.AST, path) -> str:
    names, node = [], tree
    for field, index in path:
        node = getattr(node, field) if index is None else getattr(node, field)[index]
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.append(node.name)
    return ".".join(names)


def all_mutants() -> list[Mutant]:
    out: list[Mutant] = []
    for file, module in TARGETS:
        out += mutants_of(file, module, start=len(out) + 1)
    return out
