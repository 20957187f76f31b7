"""The static cost of a CEL rule, estimated as the Kubernetes API server estimates it when it admits
a CRD (neither kmock nor cel-python estimates costs, so without this a CRD the server refuses passes
every test). Our own implementation, written from reading:

- google/cel-go checker/cost.go (v0.29, vendored by the apiextensions-apiserver of mid-2026; what
  our rules use reproduces v1.36.2's refusal to the digit): a literal costs 0, an
  identifier or a field select 1 (select on a map or object), a list literal 10, a map literal 30;
  `&&`, `||` and `?:` cost their arguments; a comprehension costs its range's size times its loop
  condition and step; string functions cost their operands' sizes times 0.1
  (StringTraversalCostFactor), `matches` (size + 1) x 0.1 times the regex length x 0.25, `in` a
  list its size, `==` the smaller of its operands' sizes x 0.1; every other call 1 + its arguments.
  A size is a literal's own, else the schema's bound (the estimator below), else 1 for a scalar.
- google/cel-go common/cost.go (the constants) and parser/macro.go (all, exists, exists_one, map and
  filter expand into comprehensions with an accumulator; their loop conditions and steps are costed).
- kubernetes/apiserver pkg/cel/library/cost.go (CostEstimator.EstimateCallCost): the Kubernetes
  library functions, e.g. quantity()/isQuantity() cost their argument's size x 0.1, quantity
  accessors and comparisons 1, `==` on two quantities 1.
- kubernetes/apiserver pkg/cel/environment/base.go: has() costs nothing (PresenceTestHasCost(false)).
- kubernetes/apiextensions-apiserver pkg/apiserver/schema/cel/compilation.go (sizeEstimator): a
  value's size is its schema's maxLength/maxItems/maxProperties (or the worst case a request could
  hold: tests/helpers/crd_limits.py), found by walking the schema along the expression's path; a map
  key's size is 0 (the key type carries no bound).

Only maximum costs and sizes are tracked: the API server compares the maximum with its limits.
What our rules use is covered; anything else raises Unsupported, so a new rule the estimator cannot
cost fails its test instead of passing unestimated. The Decl tree (a schema's CEL type with its
bounds) comes from crd_limits.decl_of.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional

import celpy

from .cel_ast import ACCU, Call, Comp, Ident, ListLit, Lit, MapLit, Select, Unsupported, parse

U64 = 2 ** 64 - 1  # cel-go's sums and products saturate here; also the size of the unknown
STRING_FACTOR = 0.1  # common.StringTraversalCostFactor
REGEX_FACTOR = 0.25  # common.RegexStringLengthCostFactor
LIST_COST, MAP_COST = 10, 30  # common.ListCreateBaseCost, MapCreateBaseCost
SCALARS = {"bool", "int", "uint", "double", "duration", "timestamp"}  # checker.isScalar: size 1


@dataclass(eq=False)
class Decl:
    """A CEL type; for a schema's value also its bound (MaxElements) and MinSerializedSize."""
    kind: str  # object, list, map, string, bytes, int, uint, double, bool, dyn, quantity, null, ...
    max_elements: int = 0
    min_size: int = 0
    fields: dict[str, "Decl"] = field(default_factory=dict)
    elem: Optional["Decl"] = None
    key: Optional["Decl"] = None


def T(kind: str, elem: Optional[Decl] = None) -> Decl:
    return Decl(kind, elem=elem)


DYN = T("dyn")


def add(a: int, b: int) -> int:
    return min(a + b, U64)


def mul(a: int, b: int) -> int:
    return min(a * b, U64)


def factor(x: int, f: float) -> int:
    """SizeEstimate.MultiplyByCostFactor: x * f rounded up, in float64 as cel-go does."""
    if x > 0 and float(x) > U64 / f:
        return U64
    c = math.ceil(float(x) * f)
    return U64 if c >= 2.0 ** 64 else int(c)



BOOL, INT, UINT, DOUBLE, STRING, BYTES = T("bool"), T("int"), T("uint"), T("double"), T("string"), T("bytes")
QUANTITY = T("quantity")  # k8s.io/apiserver pkg/cel: an object type, no size of its own
# Kubernetes library functions of O(1) cost (library/cost.go), with their result types.
_QUANTITY_METHODS = {"sign": INT, "asInteger": INT, "isInteger": BOOL, "asApproximateFloat": DOUBLE,
                     "isGreaterThan": BOOL, "isLessThan": BOOL, "compareTo": INT, "add": QUANTITY, "sub": QUANTITY}
_CONVERSIONS = {"int": INT, "uint": UINT, "double": DOUBLE, "bool": BOOL, "string": STRING, "bytes": BYTES,
                "duration": T("duration"), "timestamp": T("timestamp"), "type": T("type")}


@dataclass
class Info:
    """What the coster knows of one expression: its maximum cost and what cel-go tracks with it."""
    cost: int
    type: Decl
    path: tuple[str, ...] = ()  # cel-go's field path: a variable, then fields, @items, @keys, @values
    size: Optional[int] = None  # computeSize's maximum; None: unknown
    entry: Optional[tuple[str, int, int]] = None  # a literal container: (list|map, key size, value size)

    @property
    def known(self) -> int:  # sizeOrUnknown
        return U64 if self.size is None else self.size


def _literal(value: Any) -> tuple[Decl, int]:
    if value is None:
        return T("null"), 1
    if isinstance(value, (bool, celpy.celtypes.BoolType)):
        return BOOL, 1
    if isinstance(value, celpy.celtypes.UintType):
        return UINT, 1
    if isinstance(value, int):
        return INT, 1
    if isinstance(value, float):
        return DOUBLE, 1
    if isinstance(value, str):
        return STRING, len(value)  # runes, as computeExprSize counts them
    if isinstance(value, bytes):
        return BYTES, len(value)
    raise Unsupported(f"literal {value!r}")


def _union(a: Optional[tuple[str, int, int]], b: Optional[tuple[str, int, int]]) -> Optional[tuple[str, int, int]]:
    return None if a is None or b is None else (a[0], max(a[1], b[1]), max(a[2], b[2]))


class Coster:
    """checker.Cost for one rule whose `self` (and `oldSelf`) is the schema node `root`."""

    def __init__(self, root: Decl):
        self.root = root
        self.scopes: dict[str, list[Info]] = {}

    def bound(self, path: tuple[str, ...]) -> Optional[int]:
        """compilation.go sizeEstimator.EstimateSize: walk the schema from `self` along the path
        (its first element, the variable, is skipped whatever it is); None where it leads nowhere."""
        if not path:
            return None
        node: Optional[Decl] = self.root
        for name in path[1:]:
            if name in ("@items", "@values"):
                node = node.elem
            elif name == "@keys":
                node = node.key
            else:
                node = node.fields.get(name)
            if node is None:
                return None
        return node.max_elements

    def cost(self, e: Any) -> Info:
        info, explicit, var_size = self._cost(e)
        # computeSize's order: a size set by the call, a literal's, the schema's bound, 1 for a
        # scalar type, a local variable's.
        if explicit is not None:
            info.size = explicit
        elif self.bound(info.path) is not None:
            info.size = self.bound(info.path)
        elif info.type.kind in SCALARS:
            info.size = 1
        else:
            info.size = var_size
        return info

    def _cost(self, e: Any) -> tuple[Info, Optional[int], Optional[int]]:
        if isinstance(e, Lit):
            t, size = _literal(e.value)
            return Info(0, t), size, None
        if isinstance(e, Ident):
            if self.scopes.get(e.name):
                v = self.scopes[e.name][-1]
                return Info(1, v.type, path=v.path, entry=v.entry), None, v.size
            if e.name in ("self", "oldSelf"):
                return Info(1, self.root, path=(e.name,)), None, None
            raise Unsupported(f"undeclared variable {e.name}")
        if isinstance(e, Select):
            return self._select(e), None, None
        if isinstance(e, ListLit):
            items = [self.cost(i) for i in e.items]
            val = max((i.known for i in items), default=0)
            t = T("list", items[0].type if items else DYN)
            return Info(_sum([i.cost for i in items] + [LIST_COST]), t, entry=("list", 1, val)), len(items), None
        if isinstance(e, MapLit):
            keys = [self.cost(k) for k, _ in e.entries]
            vals = [self.cost(v) for _, v in e.entries]
            entry = ("map", max((k.known for k in keys), default=0), max((v.known for v in vals), default=0))
            t = Decl("map", key=keys[0].type if keys else DYN, elem=vals[0].type if vals else DYN)
            return Info(_sum([x.cost for x in keys + vals] + [MAP_COST]), t, entry=entry), len(keys), None
        if isinstance(e, Call):
            return self._call(e)
        if isinstance(e, Comp):
            return self._comprehension(e)
        raise Unsupported(f"expression {e!r}")

    def _select(self, e: Select) -> Info:
        op = self.cost(e.operand)
        if e.test_only:  # has(): the presence test itself is free in Kubernetes
            return Info(op.cost, BOOL)
        kind = op.type.kind
        if kind == "object":
            if e.name not in op.type.fields:
                raise Unsupported(f"undefined field {e.name}")
            t = op.type.fields[e.name]
        elif kind in ("map", "dyn"):
            t = op.type.elem or DYN
        else:
            raise Unsupported(f"select .{e.name} on {kind}")
        return Info(add(op.cost, 1 if kind in ("map", "object") else 0), t, path=op.path + (e.name,))

    def _call(self, e: Call) -> tuple[Info, Optional[int], Optional[int]]:
        if e.fn == "dyn":  # maybeUnwrapDynCall: 1 + the argument, sizes copied
            a = self.cost(e.args[0])
            return Info(add(1, a.cost), DYN, entry=a.entry), a.size, None
        args = [self.cost(a) for a in e.args]
        tgt = self.cost(e.target) if e.target is not None else None
        cost, t, size, path, entry = self._function(e.fn, tgt, args)
        return Info(add(tgt.cost if tgt else 0, cost), t, path=path or (), entry=entry), size, None

    def _function(self, fn: str, tgt: Optional[Info], args: list[Info]) -> tuple:
        """(cost with the arguments', result type, result size, path, entry) of one call."""
        argsum = _sum([a.cost for a in args])
        kinds = [a.type.kind for a in args]
        text = {"string", "bytes"}
        if fn in ("_&&_", "_||_"):
            return add(args[0].cost, args[1].cost), BOOL, None, None, None
        if fn == "_?_:_":
            t = args[1].type if args[1].type.kind == args[2].type.kind else DYN
            return (add(args[0].cost, max(args[1].cost, args[2].cost)), t, max(args[1].known, args[2].known),
                    None, _union(args[1].entry, args[2].entry))
        if fn == "_==_" and kinds == ["quantity", "quantity"]:  # library/cost.go: O(1)
            return add(1, argsum), BOOL, None, None, None
        if fn in ("_==_", "_!=_") or (fn in ("_<_", "_<=_", "_>_", "_>=_") and
                                       (text & set(kinds) or kinds == ["dyn", "dyn"])):
            return add(factor(min(args[0].known, args[1].known), STRING_FACTOR), argsum), BOOL, None, None, None
        if fn == "_+_" and (text & set(kinds) or kinds == ["dyn", "dyn"]):
            size = add(args[0].known, args[1].known)
            return add(factor(size, STRING_FACTOR), argsum), args[0].type, size, None, None
        if fn == "_+_" and "list" in kinds:
            size = add(args[0].known, args[1].known)
            return add(1, argsum), args[0].type, size, None, _union(args[0].entry, args[1].entry)
        if fn in ("_+_", "_-_", "_*_", "_/_", "_%_", "-_", "_<_", "_<=_", "_>_", "_>=_"):
            return add(1, argsum), BOOL if fn[1] in "<>" else args[0].type, None, None, None
        if fn in ("!_", "@not_strictly_false"):
            return add(1, argsum), BOOL, None, None, None
        if fn == "@in":
            if kinds[1] == "map":
                return add(1, argsum), BOOL, None, None, None
            return add(factor(args[1].known, 1), argsum), BOOL, None, None, None
        if fn == "_[_]":
            c = args[0].type
            path = args[0].path + ("@values" if c.kind == "map" else "@items",)
            size = args[0].entry[2] if args[0].entry else None
            return add(1, argsum), c.elem or DYN, size, path, None
        if fn == "size":
            return add(1, argsum), INT, None, None, None
        if tgt is not None and fn in ("startsWith", "endsWith"):
            return add(factor(args[0].known, STRING_FACTOR), argsum), BOOL, None, None, None
        if tgt is not None and fn == "contains":
            c = mul(factor(tgt.known, STRING_FACTOR), factor(args[0].known, STRING_FACTOR))
            return add(c, argsum), BOOL, None, None, None
        if tgt is not None and fn == "matches":
            c = mul(factor(add(tgt.known, 1), STRING_FACTOR), factor(args[0].known, REGEX_FACTOR))
            return add(c, argsum), BOOL, None, None, None
        if tgt is not None and fn in ("lowerAscii", "upperAscii", "trim", "substring"):
            return add(factor(tgt.known, STRING_FACTOR), argsum), STRING, tgt.known, None, None
        if tgt is None and fn in ("quantity", "isQuantity"):
            return add(factor(args[0].known, STRING_FACTOR), argsum), QUANTITY if fn == "quantity" else BOOL, \
                None, None, None
        if tgt is not None and fn in _QUANTITY_METHODS:
            return add(1, argsum), _QUANTITY_METHODS[fn], None, None, None
        if tgt is None and fn in _CONVERSIONS and len(args) == 1:
            if (fn, kinds[0]) in (("bytes", "string"), ("string", "bytes")):  # StringToBytes, BytesToString
                size = mul(args[0].known, 4) if fn == "bytes" else args[0].known
                return add(factor(args[0].known, STRING_FACTOR), argsum), _CONVERSIONS[fn], size, None, None
            return add(1, argsum), _CONVERSIONS[fn], None, None, None
        raise Unsupported(f"function {fn}")

    def _comprehension(self, c: Comp) -> tuple[Info, Optional[int], Optional[int]]:
        rng, init = self.cost(c.range), self.cost(c.init)
        self._push(ACCU, Info(0, init.type, size=init.size, entry=init.entry))
        # pushIterSingle. A range without a path gives ("@items",), which the estimator reads as
        # `self` (it skips the first element): mirrored, not corrected.
        if (rng.entry[0] if rng.entry else rng.type.kind) == "list":
            var = Info(0, rng.type.elem or DYN, path=rng.path + ("@items",), size=rng.entry[2] if rng.entry else None)
        else:  # a map's keys: Kubernetes sizes them 0 (its key type has no MaxElements)
            var = Info(0, rng.type.key or DYN, path=rng.path + ("@keys",), size=rng.entry[1] if rng.entry else None)
        self._push(c.var, var)
        cond, step = self.cost(c.cond), self.cost(c.step)
        self.scopes[c.var].pop()
        result = self.cost(c.result)
        self.scopes[ACCU].pop()
        total = _sum([rng.cost, init.cost, result.cost, mul(rng.known, add(step.cost, cond.cost))])
        if isinstance(c.init, Lit):
            return Info(total, result.type), init.size, None
        return Info(total, result.type, entry=step.entry), rng.known, None

    def _push(self, name: str, info: Info) -> None:
        self.scopes.setdefault(name, []).append(info)


def _sum(values: list[int]) -> int:
    out = 0
    for v in values:
        out = add(out, v)
    return out


def rule_cost(rule: str, root: Decl) -> int:
    """The maximum estimated cost of one rule on a value of the schema node `root` (cel.EstimateCost)."""
    return Coster(root).cost(parse(rule)).cost
