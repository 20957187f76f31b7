"""CEL rules as the expression tree cel-go's checker costs: parsed by cel-python
(celpy.Environment.compile gives its lark parse tree), operators named as cel-go names them
(`_&&_`, `@in`, `_[_]`...) and the macros expanded into comprehensions exactly as google/cel-go
parser/macro.go expands them (makeQuantifier, MakeMap, MakeFilter: an accumulator `@result`, a loop
condition and a step), since the cost of a macro is the cost of its expansion."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import celpy

ACCU = "@result"  # parser.AccumulatorName


class Unsupported(ValueError):
    """A construct the estimator does not cost (extend it from the sources in cel_cost)."""


@dataclass
class Lit:
    value: Any


@dataclass
class Ident:
    name: str


@dataclass
class Select:
    operand: Any
    name: str
    test_only: bool = False  # has()


@dataclass
class Call:
    fn: str
    args: list[Any]
    target: Any = None


@dataclass
class ListLit:
    items: list[Any]


@dataclass
class MapLit:
    entries: list[tuple[Any, Any]]


@dataclass
class Comp:
    range: Any
    var: str
    init: Any
    cond: Any
    step: Any
    result: Any


_ENV = celpy.Environment()
_BINARY = {"relation_lt": "_<_", "relation_le": "_<=_", "relation_gt": "_>_", "relation_ge": "_>=_",
           "relation_eq": "_==_", "relation_ne": "_!=_", "relation_in": "@in", "addition_add": "_+_",
           "addition_sub": "_-_", "multiplication_mul": "_*_", "multiplication_div": "_/_",
           "multiplication_mod": "_%_"}


def _macro(name: str, target: Any, args: list[Any]) -> Comp:
    """parser/macro.go: makeQuantifier, MakeMap, MakeFilter."""
    if not isinstance(args[0], Ident):
        raise Unsupported(f"{name}: the first argument must be a name")
    var, acc = args[0].name, Ident(ACCU)
    true = Lit(True)
    if name == "all":
        return Comp(target, var, true, Call("@not_strictly_false", [acc]), Call("_&&_", [acc, args[1]]), acc)
    if name == "exists":
        return Comp(target, var, Lit(False), Call("@not_strictly_false", [Call("!_", [acc])]),
                    Call("_||_", [acc, args[1]]), acc)
    if name == "exists_one":
        return Comp(target, var, Lit(0), true, Call("_?_:_", [args[1], Call("_+_", [acc, Lit(1)]), acc]),
                    Call("_==_", [acc, Lit(1)]))
    if name == "map":
        step = Call("_+_", [acc, ListLit([args[-1]])])
        if len(args) == 3:
            step = Call("_?_:_", [args[1], step, acc])
        return Comp(target, var, ListLit([]), true, step, acc)
    step = Call("_?_:_", [args[1], Call("_+_", [acc, ListLit([args[0]])]), acc])  # filter
    return Comp(target, var, ListLit([]), true, step, acc)


def parse(text: str) -> Any:
    """A rule's expression tree, parsed by cel-python (celpy.Environment.compile)."""
    return _tree(_ENV.compile(text))


def _tree(t: Any) -> Any:
    kids = [c for c in t.children if c is not None] if isinstance(t, celpy.Expression) else []
    name = t.data if isinstance(t, celpy.Expression) else None
    if name == "expr":
        return _tree(kids[0]) if len(kids) == 1 else Call("_?_:_", [_tree(k) for k in kids])
    if name in ("conditionalor", "conditionaland"):
        if len(kids) == 1:
            return _tree(kids[0])
        return Call("_||_" if name == "conditionalor" else "_&&_", [_tree(kids[0]), _tree(kids[1])])
    if name in ("relation", "addition", "multiplication"):
        if len(kids) == 1:
            return _tree(kids[0])
        op = kids[0]
        return Call(_BINARY[op.data], [_tree(op.children[0]), _tree(kids[1])])
    if name == "unary":
        if len(kids) == 1:
            return _tree(kids[0])
        return Call("!_" if kids[0].data == "unary_not" else "-_", [_tree(kids[1])])
    if name in ("member", "primary", "paren_expr"):
        return _tree(kids[0])
    if name == "member_dot":
        return Select(_tree(kids[0]), str(kids[1]))
    if name == "member_dot_arg":
        target, fn = _tree(kids[0]), str(kids[1])
        args = [_tree(a) for a in kids[2].children] if len(kids) > 2 else []
        if fn in ("all", "exists", "exists_one", "map", "filter"):
            return _macro(fn, target, args)
        return Call(fn, args, target)
    if name == "member_index":
        return Call("_[_]", [_tree(kids[0]), _tree(kids[1])])
    if name == "ident_arg":
        fn = str(kids[0])
        args = [_tree(a) for a in kids[1].children] if len(kids) > 1 else []
        if fn == "has":
            if len(args) != 1 or not isinstance(args[0], Select):
                raise Unsupported("has() takes one field selection")
            return Select(args[0].operand, args[0].name, test_only=True)
        return Call(fn, args)
    if name == "ident":
        return Ident(str(kids[0]))
    if name == "list_lit":
        return ListLit([_tree(a) for a in kids[0].children] if kids else [])
    if name == "map_lit":
        items = [_tree(a) for a in kids[0].children] if kids else []
        return MapLit(list(zip(items[0::2], items[1::2])))
    if name == "literal":
        token = kids[0]
        return Lit(_ENV.program(_ENV.compile(str(token))).evaluate({}))
    raise Unsupported(f"CEL construct {name or t!r}")
