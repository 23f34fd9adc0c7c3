"""Textual pass pipelines that mix our Python passes with upstream MLIR passes.

jaxlib's `PassManager.parse` only knows C++-registered passes, so we parse MLIR's
pipeline syntax ourselves: `builtin.module(torchtpu-verify,canonicalize,
func.func(cse),torchtpu-set-precision{mode=highest})`. Upstream passes are handed to
`PassManager.add(text)`; ours are added as Python passes, all in one PassManager so
IR printing and timing cover both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from .context import ir, passmanager
from .diagnostics import DiagnosticEngine
from .passes import PASS_REGISTRY, Pass, PassOptionError
from .pipelines import PIPELINE_REGISTRY
from .passes.base import calls_to_defined_functions, matching_brace, ops_named

# Upstream passes that only run nested on functions (JAXLIB_NOTES.md). Named at module
# level, in either syntax, they are nested under func.func for the user.
FUNC_ANCHORED_UPSTREAM = frozenset(
    {
        "chlo-legalize-to-stablehlo",
        "shape-legalize-to-stablehlo",
        "stablehlo-canonicalize-dynamism",
        "stablehlo-legalize-composite-to-call",
        "stablehlo-complex-math-expander",
    }
)

# Upstream passes known to work at module level in this jaxlib build (JAXLIB_NOTES.md).
MODULE_LEVEL_UPSTREAM = (
    "canonicalize", "cse", "inline", "sccp", "symbol-dce", "symbol-privatize",
    "remove-dead-values", "topological-sort", "strip-debuginfo", "mem2reg",
    "stablehlo-legalize-to-vhlo", "vhlo-legalize-to-stablehlo", "vhlo-to-version",
    "stablehlo-refine-shapes", "stablehlo-refine-arguments",
    "stablehlo-compatibility-expander", "stablehlo-convert-to-signless",
    "stablehlo-wrap-in-composite",
)


class PipelineError(ValueError):
    """A pipeline that does not parse or names something unknown. `column` is the
    1-based position in the pipeline text when known."""

    def __init__(self, message: str, column: int | None = None) -> None:
        self.column = column
        super().__init__(message if column is None else f"{message} (at column {column})")


@dataclass
class Element:
    name: str
    options: Optional[str] = None
    children: Optional[list["Element"]] = None
    column: int = 1

    def text(self) -> str:
        out = self.name
        if self.options is not None:
            out += "{" + self.options + "}"
        if self.children is not None:
            out += "(" + ",".join(c.text() for c in self.children) + ")"
        return out


@dataclass
class _Parser:
    text: str
    pos: int = 0

    def error(self, message: str) -> PipelineError:
        return PipelineError(message, self.pos + 1)

    def skip_ws(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def parse_list(self, closing: str | None) -> list[Element]:
        elements: list[Element] = []
        self.skip_ws()
        if closing and self.peek() == closing:
            return elements
        while True:
            elements.append(self.parse_element())
            self.skip_ws()
            if self.peek() == ",":
                self.pos += 1
                continue
            return elements

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def parse_element(self) -> Element:
        self.skip_ws()
        start = self.pos
        while self.pos < len(self.text) and (self.text[self.pos].isalnum() or self.text[self.pos] in "-_."):
            self.pos += 1
        name = self.text[start : self.pos]
        if not name:
            raise self.error(f"expected a pass or operation name, found '{self.peek() or 'end of pipeline'}'")
        element = Element(name, column=start + 1)
        if self.peek() == "{":
            j = matching_brace(self.text, self.pos)
            if j < 0:
                raise self.error(f"unbalanced '{{' in the options of '{name}'")
            element.options = self.text[self.pos + 1 : j]
            self.pos = j + 1
        if self.peek() == "(":
            self.pos += 1
            element.children = self.parse_list(")")
            self.skip_ws()
            if self.peek() != ")":
                raise self.error(f"expected ')' to close '{name}('")
            self.pos += 1
        return element


def parse_pipeline(text: str) -> list[Element]:
    """Parses MLIR textual pipeline syntax into elements (at module level: a leading
    `builtin.module(...)` is unwrapped)."""
    parser = _Parser(text)
    elements = parser.parse_list(None)
    parser.skip_ws()
    if parser.pos != len(text):
        raise parser.error(f"unexpected '{parser.peek()}' in pass pipeline")
    if len(elements) == 1 and elements[0].name == "builtin.module" and elements[0].children is not None:
        return elements[0].children
    return elements


def _report_calls(instance: Pass, op: ir.Operation) -> bool:
    """Reports each call a pass that does not follow calls would see; True if any."""
    calls = calls_to_defined_functions(op) if op.name == "builtin.module" else []
    for call in calls:
        callee = ir.FlatSymbolRefAttr(call.attributes["callee"]).value
        instance.error(call, f"does not look through calls (@{callee}); run torchtpu-inline "
                       f"first (--pass-pipeline='builtin.module(torchtpu-inline,{instance.argument})')")
    return bool(calls)


def _python_pass_callable(instance: Pass, anchor: str | None) -> Callable:
    """Wraps a pass for `PassManager.add`. Errors become located diagnostics and a pass
    failure; an exception in our own code is reported, never a traceback."""
    engine = instance.engine

    def run(op: ir.Operation, external_pass) -> None:
        before = len(engine.errors)
        try:
            # Python passes are called without an active MLIR context; entering the
            # op's context and location here spares every pass from doing it.
            with op.context, op.location:
                if not instance.follows_calls and _report_calls(instance, op):
                    external_pass.signal_pass_failure()
                    return
                for target in [op] if anchor is None else ops_named(op, anchor):
                    instance.run(target)
        except Exception as err:  # noqa: BLE001 - a bug in a pass must not kill the tool
            engine.error(
                op.location,
                f"{instance.argument}: internal error: {type(err).__name__}: {err}; "
                "please report this with the input that triggered it",
            )
        if len(engine.errors) > before:
            external_pass.signal_pass_failure()

    run.__name__ = type(instance).__name__
    return run


class PipelineBuilder:
    """Adds parsed pipeline elements to a PassManager."""

    def __init__(self, pm: passmanager.PassManager, engine: DiagnosticEngine) -> None:
        self.pm = pm
        self.engine = engine
        self.passes: list[str] = []  # pass arguments in order, for reporting

    def add_python(self, element: Element, anchor: str | None = None) -> None:
        cls = PASS_REGISTRY[element.name]
        try:
            instance = cls.from_option_string(element.options or "", self.engine)
        except PassOptionError as err:
            raise PipelineError(str(err), element.column) from None
        self.pm.add(
            _python_pass_callable(instance, anchor),
            name=cls.__name__,
            argument=cls.argument,
            description=cls.summary,
        )
        self.passes.append(cls.argument)

    def add_named_pipeline(self, element: Element) -> None:
        named = PIPELINE_REGISTRY[element.name]
        try:
            steps = named.expand(element.options or "")
        except PassOptionError as err:
            raise PipelineError(str(err), element.column) from None
        self.add(parse_pipeline(",".join(steps)))

    def add_upstream(self, text: str, element: Element) -> None:
        try:
            self.pm.add(text)
        except (ValueError, ir.MLIRError) as err:
            lines = [l.strip() for l in str(err).splitlines() if l.strip()]
            errors = [l.split("error:", 1)[1].strip() for l in lines if "error:" in l]
            hint = errors[0] if errors else (lines[0] if lines else "")
            raise PipelineError(
                f"unknown pass or invalid pass options in '{text}'"
                + (f": {hint}" if hint else "")
                + "; run torchtpu-opt --list-passes for the available passes",
                element.column,
            ) from None
        self.passes.append(text)

    def add(self, elements: list[Element]) -> None:
        for element in elements:
            if element.children is not None:
                self._add_nested(element)
            elif element.name in PASS_REGISTRY:
                self.add_python(element)
            elif element.name in PIPELINE_REGISTRY:
                self.add_named_pipeline(element)
            elif element.name in FUNC_ANCHORED_UPSTREAM:
                self.add_upstream(f"func.func({element.text()})", element)
            else:
                self.add_upstream(element.text(), element)

    def _add_nested(self, element: Element) -> None:
        anchor = element.name
        if anchor == "builtin.module":
            self.add(element.children or [])
            return
        # Batch consecutive upstream children into one nested pipeline; a Python pass
        # inside the nest runs at module level on each op of the anchor's kind.
        batch: list[Element] = []

        def flush() -> None:
            if batch:
                self.add_upstream(f"{anchor}(" + ",".join(e.text() for e in batch) + ")", batch[0])
                batch.clear()

        for child in element.children or []:
            if child.children is None and child.name in PASS_REGISTRY:
                flush()
                self.add_python(child, anchor=anchor)
            else:
                batch.append(child)
        flush()


def build_pass_manager(
    elements: list[Element], ctx: ir.Context, engine: DiagnosticEngine
) -> tuple[passmanager.PassManager, list[str]]:
    with ctx:
        pm = passmanager.PassManager("builtin.module")
        builder = PipelineBuilder(pm, engine)
        builder.add(elements)
    return pm, builder.passes


def top_level_steps(elements: list[Element]) -> list[Element]:
    """`elements` with named pipelines expanded: the steps a module-level run performs,
    one after the other (a nest such as `func.func(...)` is one step)."""
    steps: list[Element] = []
    for element in elements:
        if element.children is None and element.name in PIPELINE_REGISTRY:
            try:
                expanded = PIPELINE_REGISTRY[element.name].expand(element.options or "")
            except PassOptionError as err:
                raise PipelineError(str(err), element.column) from None
            steps.extend(top_level_steps(parse_pipeline(",".join(expanded))))
        elif element.children is not None and element.name == "builtin.module":
            steps.extend(top_level_steps(element.children))
        else:
            steps.append(element)
    return steps


def run_pipeline(
    module: ir.Operation,
    pipeline: str | list[Element],
    engine: DiagnosticEngine,
    after_each: Callable[[int, Element, ir.Operation], None] | None = None,
) -> bool:
    """Library entry point: runs `pipeline` on `module`, reporting into `engine`.
    Returns True on success. With `after_each`, the top-level steps run one at a time and
    `after_each(index, step, module)` is called after each successful step (dumps)."""
    elements = parse_pipeline(pipeline) if isinstance(pipeline, str) else pipeline
    if after_each is None:
        return _run(module, elements, engine)
    for index, step in enumerate(top_level_steps(elements), start=1):
        if not _run(module, [step], engine):
            return False
        after_each(index, step, module)
    return True


def _run(module: ir.Operation, elements: list[Element], engine: DiagnosticEngine) -> bool:
    ctx = module.context
    pm, _ = build_pass_manager(elements, ctx, engine)
    with engine.capture(ctx):
        try:
            pm.run(module)
        except ir.MLIRError as err:
            if not engine.has_errors():
                engine.extend_from_mlir_error(err)
            return False
    return not engine.has_errors()
