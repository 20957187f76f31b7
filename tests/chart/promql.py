"""Just enough PromQL to check a dashboard: the selectors (metric names and label matchers), the
label lists of by/without/on/ignoring/group_*, and the labels a query's result keeps. Not a full
parser: it reads the expressions the grpojob dashboard writes and fails loudly on anything else."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

_TOKEN = re.compile(r"""
    (?P<str>"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|`[^`]*`)
  | (?P<range>\[[^\]]*\])
  | (?P<duration>\d+(?:ms|s|m|h|d|w|y)\b)
  | (?P<num>\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)
  | (?P<ident>[a-zA-Z_:][a-zA-Z0-9_:]*)
  | (?P<op>=~|!~|!=|==|>=|<=|[-+*/%^=<>(){},])
  | (?P<space>\s+)
""", re.X)
_GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "atan2", "inf", "nan"}
AGGREGATIONS = {"sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk", "quantile",
                "count_values", "group"}


@dataclass
class Selector:
    names: frozenset[str]  # one metric name, or the alternatives of a __name__=~"a|b" matcher
    matchers: dict[str, tuple[str, str]] = field(default_factory=dict)  # label -> (op, value)


@dataclass
class Query:
    selectors: list[Selector]
    groupings: list[tuple[str, tuple[str, ...]]]  # (keyword, labels)
    outer_aggregation: bool  # the whole expression is one aggregation call (labels dropped or kept by `by`)

    @property
    def metric_names(self) -> set[str]:
        return {n for s in self.selectors for n in s.names}


def _tokens(expr: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if not m:
            raise ValueError(f"cannot read PromQL at {expr[pos:pos + 20]!r} in {expr!r}")
        pos = m.end()
        if m.lastgroup != "space":
            out.append((m.lastgroup, m.group()))
    return out


def _unquote(s: str) -> str:
    return s[1:-1]


def parse(expr: str) -> Query:
    toks = _tokens(expr)
    selectors: list[Selector] = []
    groupings: list[tuple[str, tuple[str, ...]]] = []
    i = 0

    def matchers(j: int) -> tuple[dict[str, tuple[str, str]], int]:
        """Parse `{a="x", b=~"y"}` starting at the `{` at j; return matchers and the index after `}`."""
        found, j = {}, j + 1
        while toks[j] != ("op", "}"):
            (k1, label), (k2, op), (k3, value) = toks[j:j + 3]
            if k1 != "ident" or k2 != "op" or op not in ("=", "!=", "=~", "!~") or k3 != "str":
                raise ValueError(f"bad label matcher in {expr!r}")
            found[label] = (op, _unquote(value))
            j += 3
            if toks[j] == ("op", ","):
                j += 1
        return found, j + 1

    while i < len(toks):
        kind, text = toks[i]
        nxt = toks[i + 1] if i + 1 < len(toks) else ("", "")
        if kind == "ident" and text in _GROUPING and nxt == ("op", "("):
            j = i + 2
            labels = []
            while toks[j] != ("op", ")"):
                if toks[j][0] == "ident":
                    labels.append(toks[j][1])
                j += 1
            groupings.append((text, tuple(labels)))
            i = j + 1
        elif kind == "ident" and (nxt == ("op", "(") or (text in AGGREGATIONS and nxt[1] in _GROUPING)):
            i += 1  # a function or aggregation call
        elif kind == "ident" and text not in _KEYWORDS:
            found: dict[str, tuple[str, str]] = {}
            i += 1
            if nxt == ("op", "{"):
                found, i = matchers(i)
            selectors.append(Selector(frozenset([text]), found))
        elif (kind, text) == ("op", "{"):
            found, i = matchers(i)
            op, value = found.pop("__name__", ("", ""))
            if op not in ("=", "=~") or not re.fullmatch(r"[a-zA-Z0-9_:|]+", value):
                raise ValueError(f"selector without a plain metric name in {expr!r}")
            selectors.append(Selector(frozenset(value.split("|")), found))
        else:
            i += 1
    return Query(selectors, groupings, _single_aggregation(toks))


def _after_parens(toks: list[tuple[str, str]], i: int) -> int:
    """Index after the parenthesised group opening at i (-1 when there is none)."""
    if i >= len(toks) or toks[i] != ("op", "("):
        return -1
    depth = 0
    for j in range(i, len(toks)):
        depth += {("op", "("): 1, ("op", ")"): -1}.get(toks[j], 0)
        if depth == 0:
            return j + 1
    raise ValueError("unbalanced parentheses")


def _single_aggregation(toks: list[tuple[str, str]]) -> bool:
    """True for `agg [by|without (...)] (...) [by|without (...)]` and nothing else around it."""
    if not toks or toks[0][0] != "ident" or toks[0][1] not in AGGREGATIONS:
        return False

    def modifier(i: int) -> int:
        return _after_parens(toks, i + 1) if i < len(toks) and toks[i][1] in ("by", "without") else i

    i = _after_parens(toks, modifier(1))
    return i != -1 and modifier(i) == len(toks)


def parse_label_values(query: str) -> tuple[Query, str]:
    """A Grafana variable query `label_values(selector, label)`."""
    m = re.fullmatch(r"\s*label_values\((.*),\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)\s*", query, re.S)
    if not m:
        raise ValueError(f"not a label_values() query: {query!r}")
    return parse(m.group(1)), m.group(2)


def result_labels(q: Query, available: set[str]) -> set[str]:
    """Labels the query's series keep: `by` lists intersected (minus `le`, eaten by
    histogram_quantile), nothing after a bare aggregation, else all that were available."""
    by_lists = [set(labels) for kw, labels in q.groupings if kw == "by"]
    if by_lists:
        return set.intersection(*by_lists) - {"le"}
    if q.outer_aggregation:
        without = [set(labels) for kw, labels in q.groupings if kw == "without"]
        return available - set().union(*without) if without else set()
    return available
