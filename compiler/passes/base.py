"""The pass declaration model and registry.

A pass is a class with `argument` (its flag, e.g. `torchtpu-set-precision`), `summary`,
`description` and typed `options`, registered with `@register_pass`. The registry
drives `torchtpu-opt`'s flags, `--help` and `--list-passes`, the pipeline parser and
`docs/reference/passes.md`.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from ..context import ir
from ..diagnostics import DiagnosticEngine

_TRUE = {"true", "1", "on", "yes"}
_FALSE = {"false", "0", "off", "no"}
_TYPE_WORDS = {str: "a string", int: "an integer", float: "a number", bool: "true or false"}


class PassOptionError(ValueError):
    """A pass option that does not exist or does not parse; the message says which."""


@dataclass(frozen=True)
class Option:
    name: str
    type: type  # str, int, float or bool
    default: Any
    help: str
    choices: tuple[str, ...] = ()

    def convert(self, pass_argument: str, text: str) -> Any:
        try:
            if self.type is bool:
                lowered = text.lower()
                if lowered in _TRUE:
                    return True
                if lowered in _FALSE:
                    return False
                raise ValueError
            value = self.type(text)
        except ValueError:
            raise PassOptionError(
                f"{pass_argument}: option '{self.name}' expects {_TYPE_WORDS[self.type]}, got '{text}'"
            ) from None
        if self.choices and value not in self.choices:
            raise PassOptionError(
                f"{pass_argument}: option '{self.name}' must be one of "
                f"{', '.join(self.choices)}; got '{text}'"
            )
        return value

    def describe(self) -> str:
        kind = "|".join(self.choices) if self.choices else self.type.__name__
        return f"{self.name}=<{kind}> (default: {str(self.default).lower() if self.type is bool else self.default})"


class Pass:
    """Base class of every torch_tpu pass. Subclasses declare the class attributes and
    implement `run(op)`, reporting problems with `self.error(...)` and friends."""

    argument: ClassVar[str]
    summary: ClassVar[str]
    description: ClassVar[str] = ""
    options: ClassVar[tuple[Option, ...]] = ()
    # False for passes that work on one function at a time and do not look through
    # `func.call`: they run after `torchtpu-inline`, and the pipeline runner reports a
    # call to a function defined in the module instead of running them on it.
    follows_calls: ClassVar[bool] = True

    def __init__(self, engine: DiagnosticEngine | None = None, **options: Any) -> None:
        self.engine = engine if engine is not None else DiagnosticEngine()
        declared = {o.name: o for o in self.options}
        unknown = set(options) - declared.keys()
        if unknown:
            raise PassOptionError(
                f"{self.argument}: unknown option(s) {', '.join(sorted(unknown))}; "
                f"available: {', '.join(declared) or 'none'}"
            )
        for option in self.options:
            value = options.get(option.name, option.default)
            if isinstance(value, str) and option.type is not str:
                value = option.convert(self.argument, value)
            elif option.choices and value not in option.choices:
                value = option.convert(self.argument, str(value))
            setattr(self, option.name.replace("-", "_"), value)

    @classmethod
    def from_option_string(cls, text: str, engine: DiagnosticEngine | None = None) -> "Pass":
        """Builds the pass from MLIR's option syntax: `mode=highest other=1`."""
        return cls(engine, **parse_option_string(cls.argument, cls.options, text))

    def run(self, op: ir.Operation) -> None:
        """Transforms `op` in place. The pipeline calls it with `op`'s context and
        location active, so IR can be built without passing them around."""
        raise NotImplementedError

    # -- diagnostics, prefixed with the pass argument ----------------------------------
    def error(self, where, message: str, notes=()) -> None:
        self.engine.error(_location(where), f"{self.argument}: {message}", notes)

    def warning(self, where, message: str, notes=()) -> None:
        self.engine.warning(_location(where), f"{self.argument}: {message}", notes)

    def remark(self, where, message: str, notes=()) -> None:
        self.engine.remark(_location(where), f"{self.argument}: {message}", notes)


def ops_named(root: ir.Operation, *names: str) -> list[ir.Operation]:
    """The operations below and including `root` whose name is one of `names`, in
    post-order (the order `walk` visits them). Collected first, so callers may rewrite
    or erase them while iterating."""
    wanted = frozenset(names)
    found: list[ir.Operation] = []

    def collect(inner: ir.Operation) -> ir.WalkResult:
        if inner.operation.name in wanted:
            found.append(inner.operation)
        return ir.WalkResult.ADVANCE

    root.walk(collect)
    return found


def operation_of(owner) -> ir.Operation:
    """`owner` (a use's owner, a value's defining op, a parent) as an Operation: the bindings
    hand back OpViews, which compare unequal to the Operation they view."""
    return owner.operation if hasattr(owner, "operation") else owner


def defining_op(value: ir.Value) -> ir.Operation | None:
    """The op that defines `value`; None for a block argument."""
    owner = value.owner
    return None if isinstance(owner, ir.Block) else operation_of(owner)


def calls_to_defined_functions(module: ir.Operation) -> list[ir.Operation]:
    """The `func.call`s in `module` whose callee is a function with a body in `module`."""
    defined = {
        ir.StringAttr(op.operation.attributes["sym_name"]).value
        for op in module.regions[0].blocks[0].operations
        if op.operation.name == "func.func" and len(op.operation.regions[0].blocks) > 0
    } if module.regions else set()
    return [
        call for call in ops_named(module, "func.call")
        if ir.FlatSymbolRefAttr(call.attributes["callee"]).value in defined
    ]


def parse_option_string(argument: str, options: tuple[Option, ...], text: str) -> dict[str, Any]:
    """The options given in MLIR's syntax (`mode=highest flag`), converted and checked
    against `options` (of the pass or pipeline `argument`)."""
    declared = {o.name: o for o in options}
    values: dict[str, Any] = {}
    for key, value in split_options(text):
        option = declared.get(key)
        if option is None:
            raise PassOptionError(
                f"{argument}: unknown option '{key}'; available: {', '.join(declared) or 'none'}"
            )
        if value is None:
            if option.type is not bool:
                raise PassOptionError(f"{argument}: option '{key}' needs a value ({option.describe()})")
            value = "true"
        values[key] = option.convert(argument, value)
    return values


def _location(where):
    if where is None or isinstance(where, ir.Location):
        return where
    if hasattr(where, "location"):
        return where.location
    return where


def matching_brace(text: str, start: int) -> int:
    """Index of the `}` closing the `{` at `start`, skipping nested braces and quoted
    strings ("..." or '...'); -1 when there is none."""
    depth, i, n = 0, start, len(text)
    while i < n:
        ch = text[i]
        if ch in "\"'":
            end = text.find(ch, i + 1)
            if end < 0:
                return -1
            i = end
        elif ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return -1


def split_options(text: str) -> list[tuple[str, str | None]]:
    """Splits `a=1 b="x y" c={nested opts} flag` into (key, value) pairs."""
    pairs: list[tuple[str, str | None]] = []
    i, n = 0, len(text)
    while i < n:
        while i < n and text[i].isspace():
            i += 1
        if i >= n:
            break
        start = i
        while i < n and not text[i].isspace() and text[i] != "=":
            i += 1
        key = text[start:i]
        if i < n and text[i] == "=":
            i += 1
            if i < n and text[i] in "\"'":
                quote = text[i]
                end = text.find(quote, i + 1)
                if end < 0:
                    raise PassOptionError(f"unterminated quote in pass options '{text}'")
                value = text[i + 1 : end]
                i = end + 1
            elif i < n and text[i] == "{":
                j = matching_brace(text, i)
                if j < 0:
                    raise PassOptionError(f"unbalanced '{{' in pass options '{text}'")
                value = text[i + 1 : j]
                i = j + 1
            else:
                start = i
                while i < n and not text[i].isspace():
                    i += 1
                value = text[start:i]
            pairs.append((key, value))
        else:
            pairs.append((key, None))
    return pairs


class PassRegistry(Mapping[str, "type[Pass]"]):
    """Pass argument -> pass class. Our passes are declared with the module that defines
    them and imported on first lookup: a pipeline loads only the passes it names, so
    `torchtpu-opt` on a `.mlir` file never imports torch (the view passes use it)."""

    def __init__(self) -> None:
        self._loaded: dict[str, type[Pass]] = {}
        self._declared: dict[str, str] = {}  # argument -> module that registers it

    def declare(self, argument: str, module: str) -> None:
        self._declared[argument] = module

    def add(self, cls: type[Pass]) -> None:
        if cls.argument in self._loaded:
            raise ValueError(f"pass '{cls.argument}' registered twice")
        self._loaded[cls.argument] = cls

    def __getitem__(self, argument: str) -> type[Pass]:
        if argument not in self._loaded and argument in self._declared:
            importlib.import_module(self._declared[argument])
            if argument not in self._loaded:
                raise KeyError(f"module {self._declared[argument]} does not register pass '{argument}'")
        return self._loaded[argument]

    def __contains__(self, argument: object) -> bool:
        return argument in self._loaded or argument in self._declared

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(set(self._loaded) | set(self._declared)))

    def __len__(self) -> int:
        return len(set(self._loaded) | set(self._declared))

    def pop(self, argument: str, *default: Any) -> Any:
        self._declared.pop(argument, None)
        return self._loaded.pop(argument, *default)


PASS_REGISTRY = PassRegistry()


def register_pass(cls: type[Pass]) -> type[Pass]:
    for attr in ("argument", "summary"):
        if not getattr(cls, attr, None):
            raise TypeError(f"pass {cls.__name__} must declare '{attr}'")
    PASS_REGISTRY.add(cls)
    return cls
