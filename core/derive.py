"""Derived features: named expressions over other features (docs/ARCHITECTURE.md, "Features
as definitions").

One parser and one evaluator. :func:`parse` reads an expression into a small tree;
:func:`evaluate` walks it over a backend: :class:`NumpyBackend` (vectorised over the
candidates at the request time, a missing value is NaN) or :class:`SparkBackend` (columns for
the backfill, built-in expressions the RAPIDS Accelerator plans on the GPU; a missing value is
null). Both give the same values: a division by zero, ``log1p`` of a value at or below −1 and
any operation on a missing value are missing.

The language::

    expr   := term (("+" | "-") term)*
    term   := unary (("*" | "/") unary)*
    unary  := "-" unary | atom
    atom   := NUMBER | NAME | NAME "(" args ")" | "(" expr ")"
    args   := arg ("," arg)*        arg := expr | "[" NUMBER ("," NUMBER)* "]" | NAME "=" expr

A NAME is a feature (``user_events``), an aggregation's output as the API names it
(``group:output``), a request column or an attribute. The functions:

- ``log1p(x)``, ``clip(x, low, high)``, ``coalesce(a, b, …)`` (the first not missing);
- ``ratio(a, b, prior=p, weight=w)`` = ``(a + p·w) / (b + w)``, a smoothed rate;
- ``bucketize(x, [e1, …, ek])``: how many edges are at or below ``x`` (0 to k);
- ``seconds_since(t)``: the seconds from ``t`` to the request's time (the example's, in the
  backfill); ``t`` in µs since the epoch, as a ``latest`` output holds it.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, NoReturn, TypeVar, cast

import numpy as np
from pydantic import field_validator

from featureline.core.aggregations import Name
from featureline.core.errors import ConfigError
from featureline.core.settings import Settings
from featureline.core.time_rule import MICROS

if TYPE_CHECKING:
    from pyspark.sql import Column

T = TypeVar("T")

_TOKEN = re.compile(r"\s*(?:(?P<number>\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?)"
                    r"|(?P<name>[A-Za-z_]\w*(?::[A-Za-z_]\w*)?)|(?P<op>[-+*/(),\[\]=]))")


@dataclass(frozen=True)
class Num:
    value: float  # a number


@dataclass(frozen=True)
class Ref:
    # A feature, an aggregation's output, a request column or an attribute, by name.
    name: str


@dataclass(frozen=True)
class Neg:
    operand: Node  # minus it


@dataclass(frozen=True)
class Binary:
    op: str  # + - * /
    left: Node
    right: Node


@dataclass(frozen=True)
class Call:
    """A function of :data:`FUNCTIONS`: its arguments, bucketize's edges, ratio's prior and
    weight."""

    function: str
    args: tuple[Node, ...]
    edges: tuple[float, ...] = ()
    prior: Node | None = None
    weight: Node | None = None


Node = Num | Ref | Neg | Binary | Call

# Per function: how many positional arguments it takes (at least, at most; None: any).
FUNCTIONS: dict[str, tuple[int, int | None]] = {
    "log1p": (1, 1), "clip": (3, 3), "coalesce": (1, None), "ratio": (2, 2),
    "bucketize": (1, 1), "seconds_since": (1, 1)}


class DeriveError(ConfigError):
    """An expression that cannot be read, named by its entry."""


def references(node: Node) -> set[str]:
    """The names an expression reads."""
    if isinstance(node, Ref):
        return {node.name}
    if isinstance(node, Num):
        return set()
    if isinstance(node, Neg):
        return references(node.operand)
    if isinstance(node, Binary):
        return references(node.left) | references(node.right)
    found = set().union(*(references(arg) for arg in node.args))
    return found | {name for part in (node.prior, node.weight) if part is not None
                    for name in references(part)}


def parse(text: str, key: str = "derive") -> Node:
    """The tree of ``text``; a :class:`DeriveError` naming ``key`` and where it went wrong."""
    return _Parser(text, key).parse()


@functools.lru_cache(maxsize=1024)
def parsed(text: str) -> Node:
    """:func:`parse` of an expression already checked (a configuration's, metadata.json's),
    read once per process."""
    return parse(text)


class DeriveSpec(Settings):
    """One entry of ``derive``: a feature named ``name``, the value of ``expr``."""

    # The feature's name, as the examples, metadata.json and the API name it.
    name: Name
    # Its expression over other features, aggregation outputs and numeric columns.
    expr: str

    @field_validator("expr")
    @classmethod
    def _expr(cls, expr: str) -> str:
        try:
            parse(expr, "expr")
        except DeriveError as exc:
            raise ValueError(exc.message) from None
        return expr

    @property
    def tree(self) -> Node:
        return parsed(self.expr)


class _Parser:
    def __init__(self, text: str, key: str) -> None:
        self.text, self.key = text, key
        self.tokens: list[tuple[str, str, int]] = []
        at = 0
        while at < len(text):
            match = _TOKEN.match(text, at)
            if match is None or match.end() == at:
                if text[at:].strip() == "":
                    break
                rest = text[at:].lstrip()
                self.fail(f"unexpected {rest[:1]!r}", len(text) - len(rest))
            kind = match.lastgroup
            assert kind is not None
            self.tokens.append((kind, match.group(kind), match.start(kind)))
            at = match.end()
        self.at = 0

    def fail(self, why: str, position: int | None = None) -> NoReturn:
        if position is None:
            position = self.tokens[self.at][2] if self.at < len(self.tokens) else len(self.text)
        raise DeriveError(self.key, f"{why} at character {position + 1} of {self.text!r}")

    def peek(self) -> tuple[str, str] | None:
        if self.at >= len(self.tokens):
            return None
        kind, value, _ = self.tokens[self.at]
        return kind, value

    def take(self, value: str | None = None) -> tuple[str, str]:
        token = self.peek()
        if token is None:
            self.fail("the expression ends early" if value is None else f"expected {value!r}")
        if value is not None and token != ("op", value):
            self.fail(f"expected {value!r}, found {token[1]!r}")
        self.at += 1
        return token

    def parse(self) -> Node:
        if not self.tokens:
            self.fail("an empty expression", 0)
        node = self.expr()
        left = self.peek()
        if left is not None:
            self.fail(f"unexpected {left[1]!r}")
        return node

    def expr(self) -> Node:
        return self.left_to_right("+-", self.term)

    def term(self) -> Node:
        return self.left_to_right("*/", self.unary)

    def left_to_right(self, ops: str, operand: Callable[[], Node]) -> Node:
        """Operands joined by any of ``ops``, grouped from the left."""
        node = operand()
        while (token := self.peek()) is not None and token[0] == "op" and token[1] in ops:
            self.take()
            node = Binary(token[1], node, operand())
        return node

    def unary(self) -> Node:
        if self.peek() == ("op", "-"):
            self.take()
            return Neg(self.unary())
        return self.atom()

    def atom(self) -> Node:
        kind, value = self.take()
        if kind == "number":
            return Num(float(value))
        if (kind, value) == ("op", "("):
            node = self.expr()
            self.take(")")
            return node
        if kind != "name":
            self.at -= 1
            self.fail(f"unexpected {value!r}")
        if self.peek() != ("op", "("):
            return Ref(value)
        return self.call(value)

    def call(self, function: str) -> Node:
        if function not in FUNCTIONS:
            self.at -= 1
            self.fail(f"unknown function {function!r} (known: {', '.join(FUNCTIONS)})")
        self.take("(")
        args: list[Node] = []
        edges: tuple[float, ...] = ()
        named: dict[str, Node] = {}
        while True:
            if self.peek() == ("op", "["):
                edges = self.edges()
            elif (self.at + 1 < len(self.tokens) and self.tokens[self.at][0] == "name"
                  and self.tokens[self.at + 1][:2] == ("op", "=")):
                name = self.take()[1]
                self.take("=")
                if name not in ("prior", "weight") or function != "ratio":
                    self.at -= 2
                    self.fail(f"{function}() takes no argument {name!r}")
                named[name] = self.expr()
            else:
                args.append(self.expr())
            if self.peek() != ("op", ","):
                break
            self.take(",")
        self.take(")")
        low, high = FUNCTIONS[function]
        if len(args) < low or (high is not None and len(args) > high):
            self.at -= 1
            self.fail(f"{function}() takes {low if low == high else f'{low} or more'} "
                      f"argument(s), not {len(args)}")
        if function == "bucketize" and not edges:
            self.fail("bucketize() needs its edges: bucketize(x, [e1, e2, ...])")
        if function == "ratio" and set(named) != {"prior", "weight"}:
            self.fail("ratio() needs prior= and weight=: ratio(a, b, prior=p, weight=w)")
        return Call(function, tuple(args), edges, named.get("prior"), named.get("weight"))

    def edges(self) -> tuple[float, ...]:
        self.take("[")
        found = []
        while True:
            sign = -1.0 if self.peek() == ("op", "-") and self.take() else 1.0
            kind, value = self.take()
            if kind != "number":
                self.at -= 1
                self.fail("an edge is a number")
            found.append(sign * float(value))
            if self.peek() != ("op", ","):
                break
            self.take(",")
        self.take("]")
        if found != sorted(found) or len(set(found)) != len(found):
            self.fail("the edges must increase")
        return tuple(found)


class Backend(Generic[T]):
    """What :func:`evaluate` builds values with."""

    def ref(self, name: str) -> T:
        raise NotImplementedError

    def num(self, value: float) -> T:
        raise NotImplementedError

    def binary(self, op: str, left: T, right: T) -> T:
        """``left op right``: + - * as NumPy arrays and Spark columns both read them."""
        if op == "/":
            return self.divide(left, right)
        a, b = cast(Any, left), cast(Any, right)
        return cast(T, a + b if op == "+" else a - b if op == "-" else a * b)

    def divide(self, left: T, right: T) -> T:
        """``left / right``, missing where ``right`` is 0."""
        raise NotImplementedError

    def neg(self, value: T) -> T:
        raise NotImplementedError

    def call(self, function: str, args: list[T], edges: tuple[float, ...]) -> T:
        raise NotImplementedError


def evaluate(node: Node, backend: Backend[T]) -> T:
    """The expression's value over ``backend``."""
    if isinstance(node, Num):
        return backend.num(node.value)
    if isinstance(node, Ref):
        return backend.ref(node.name)
    if isinstance(node, Neg):
        return backend.neg(evaluate(node.operand, backend))
    if isinstance(node, Binary):
        return backend.binary(node.op, evaluate(node.left, backend),
                              evaluate(node.right, backend))
    args = [evaluate(arg, backend) for arg in node.args]
    if node.function == "ratio":
        assert node.prior is not None and node.weight is not None
        prior, weight = evaluate(node.prior, backend), evaluate(node.weight, backend)
        # (a + p·w) / (b + w)
        return backend.binary("/", backend.binary("+", args[0], backend.binary("*", prior,
                                                                              weight)),
                              backend.binary("+", args[1], weight))
    return backend.call(node.function, args, node.edges)


class NumpyBackend(Backend[np.ndarray]):
    """Values as float arrays over the candidates (a missing value is NaN); ``now_us``: the
    request's time, µs since the epoch."""

    def __init__(self, values: dict[str, Any], now_us: float = math.nan) -> None:
        self.values, self.now_us = values, now_us

    def ref(self, name: str) -> np.ndarray:
        return np.asarray(self.values[name], dtype=np.float64)

    def num(self, value: float) -> np.ndarray:
        return np.asarray(value, dtype=np.float64)

    def divide(self, left: np.ndarray, right: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore"):
            return np.where(right != 0, left / np.where(right != 0, right, 1.0), np.nan)

    def neg(self, value: np.ndarray) -> np.ndarray:
        return -value

    def call(self, function: str, args: list[np.ndarray], edges: tuple[float, ...]
             ) -> np.ndarray:
        x = args[0]
        with np.errstate(invalid="ignore"):
            if function == "log1p":
                return np.where(x > -1, np.log1p(np.where(x > -1, x, 0.0)), np.nan)
            if function == "clip":
                low, high = args[1], args[2]
                return np.where(np.isnan(x) | np.isnan(low) | np.isnan(high), np.nan,
                                np.minimum(np.maximum(x, low), high))
            if function == "coalesce":
                found = np.full(np.broadcast(*args).shape, np.nan)
                for arg in reversed(args):
                    found = np.where(np.isnan(arg), found, arg)
                return found
            if function == "bucketize":
                counted = np.searchsorted(np.asarray(edges), x, side="right").astype(np.float64)
                return np.where(np.isnan(x), np.nan, counted)
        assert function == "seconds_since"
        return (self.now_us - x) / MICROS


class SparkBackend(Backend["Column"]):
    """Values as Spark columns (a missing value is null); ``now_us``: the example's time (µs
    since the epoch), what ``seconds_since`` measures to."""

    def __init__(self, columns: dict[str, Column], now_us: Column) -> None:
        self.columns, self.now_us = columns, now_us

    @staticmethod
    def _f() -> Any:
        from pyspark.sql import functions

        return functions

    def ref(self, name: str) -> Column:
        return self.columns[name].cast("double")

    def num(self, value: float) -> Column:
        return self._f().lit(float(value))

    def divide(self, left: Column, right: Column) -> Column:
        return self._f().when(right != 0, left / right)

    def neg(self, value: Column) -> Column:
        return -value

    def call(self, function: str, args: list[Column], edges: tuple[float, ...]) -> Column:
        F = self._f()
        x = args[0]
        if function == "log1p":
            return F.when(x > -1, F.log1p(x))
        if function == "clip":  # greatest and least skip nulls: a missing bound is missing
            return F.when(x.isNotNull() & args[1].isNotNull() & args[2].isNotNull(),
                          F.least(F.greatest(x, args[1]), args[2]))
        if function == "coalesce":
            return F.coalesce(*args)
        if function == "bucketize":
            counted = sum((F.when(x >= F.lit(edge), 1).otherwise(0) for edge in edges),
                          F.lit(0))
            return F.when(x.isNotNull(), counted.cast("double"))
        assert function == "seconds_since"
        return (self.now_us.cast("double") - x) / MICROS
