"""torchtpu-inverse-views: "mem2reg for views" — references become values."""

from __future__ import annotations

from torch_tpu.core import attributes

from ..context import func, ir
from ..dialect import ref_tensor_type
from ..dialect.view_ops import VIEW_OPS
from .base import Pass, ops_named, register_pass
# The view semantics (view_semantics.py) load torch: imported where the pass runs, so that
# listing the pass (`torchtpu-opt --help`) does not.

ALIASING_OUTPUT = attributes.ALIASING_OUTPUT


@register_pass
class InverseViewsPass(Pass):
    argument = "torchtpu-inverse-views"
    summary = "Replace references, views, loads and stores by pure StableHLO values"
    description = (
        "Walks each function in program order tracking the current value of every root "
        "reference (a `!torchtpu.ref` argument or a `torchtpu.alloc`). A `torchtpu.load` "
        "of a view becomes the view's forward computation on its source's current value; "
        "a `torchtpu.store` into a view becomes the view's inverse (`dynamic_update_slice`, "
        "scatter, inverse permute/reshape/bitcast) applied to the source, recursively up "
        "to the root, so later loads of any view see the write. Reference arguments "
        "become tensor arguments; each one written is returned as an extra result (in "
        "argument order) and marked `tf.aliasing_output`, so the runtime donates its "
        "buffer. Runs after torchtpu-decompose-views (diagonal/unfold/as_strided must be "
        "decomposed); the output has no torchtpu ops or types left."
    )
    follows_calls = False

    def run(self, op: ir.Operation) -> None:
        for fn in ops_named(op, "func.func"):
            if len(fn.regions[0].blocks):
                _FunctionRewrite(self, fn).run()


class _Abort(Exception):
    pass


class _FunctionRewrite:
    def __init__(self, owner: InverseViewsPass, fn: ir.Operation) -> None:
        self.owner = owner
        self.fn = fn
        self.current: dict[ir.Value, ir.Value] = {}  # root reference -> its current value
        self.view_of: dict[ir.Value, ir.Operation] = {}  # view reference -> its view op
        self.ref_args: list[ir.BlockArgument] = []
        self.stored: set[ir.Value] = set()  # root references written at least once

    def fail(self, where, message: str) -> None:
        self.owner.error(where, message)
        raise _Abort

    def run(self) -> None:
        try:
            self._run()
        except _Abort:
            return

    def _run(self) -> None:
        from .view_semantics import COMPLEX_VIEWS

        blocks = list(self.fn.regions[0].blocks)
        if len(blocks) != 1:
            if any(ref_tensor_type(a.type) is not None for b in blocks for a in b.arguments):
                self.fail(self.fn, "functions with references must have a single block")
            return
        block = blocks[0]
        for arg in block.arguments:
            tensor = ref_tensor_type(arg.type)
            if tensor is not None:
                arg.set_type(tensor)  # its value on entry is the argument itself
                self.current[arg] = arg
                self.ref_args.append(arg)
        dead: list[ir.Operation] = []
        for op in list(block.operations):
            op = op.operation
            name = op.name
            if name in COMPLEX_VIEWS:
                self.fail(op, f"'{name}' must be decomposed first; run torchtpu-decompose-views before this pass")
            if name in VIEW_OPS:
                self.view_of[op.results[0]] = op
                dead.append(op)
            elif name == "torchtpu.alloc":
                self.current[op.results[0]] = op.operands[0]
                dead.append(op)
            elif name == "torchtpu.load":
                with ir.InsertionPoint(op), op.location:
                    value = self.value_of(op.operands[0], op)
                op.results[0].replace_all_uses_with(value)
                op.erase()
            elif name == "torchtpu.store":
                with ir.InsertionPoint(op), op.location:
                    self.store(op.operands[0], op.operands[1], op)
                op.erase()
            elif name == "func.return":
                self._return(op)
            else:
                for index, operand in enumerate(op.operands):
                    if ref_tensor_type(operand.type) is not None or operand in self.view_of:
                        self.fail(op, f"'{name}' uses a reference (operand #{index}); only torchtpu view "
                                      "ops, load and store may use references")
                for region in op.regions:
                    self._check_no_refs_inside(region)
        for op in reversed(dead):
            op.erase()

    def _check_no_refs_inside(self, region: ir.Region) -> None:
        def visit(inner: ir.Operation) -> ir.WalkResult:
            for operand in inner.operation.operands:
                if ref_tensor_type(operand.type) is not None or operand in self.view_of:
                    self.fail(inner.operation, "references cannot be used inside regions")
            return ir.WalkResult.ADVANCE

        for block in region.blocks:
            for inner in block.operations:
                inner.operation.walk(visit)

    def value_of(self, ref: ir.Value, at: ir.Operation) -> ir.Value:
        """The current value seen through `ref` (building the view chain's forward ops)."""
        from .view_semantics import ViewError, forward

        if ref in self.current:
            return self.current[ref]
        view = self.view_of.get(ref)
        if view is None:
            self.fail(at, "reference is neither a function argument, a torchtpu.alloc nor a view of one")
        source = self.value_of(view.operands[0], at)
        try:
            return forward(view, source)
        except ViewError as err:
            self.fail(view, str(err))

    def store(self, ref: ir.Value, value: ir.Value, at: ir.Operation) -> None:
        """Makes `value` the content of `ref`: updates its root through the inverse views."""
        from .view_semantics import ViewError, inverse

        while ref not in self.current:
            view = self.view_of.get(ref)
            if view is None:
                self.fail(at, "store into a reference that is neither a function argument, a "
                              "torchtpu.alloc nor a view of one")
            source_ref = view.operands[0]
            source = self.value_of(source_ref, at)
            try:
                value = inverse(view, source, value)
            except ViewError as err:
                self.owner.error(at, str(err), notes=[(view.location, "through this view")])
                raise _Abort from None
            ref = source_ref
        self.current[ref] = value
        self.stored.add(ref)

    def _return(self, ret: ir.Operation) -> None:
        written = [a for a in self.ref_args if a in self.stored]
        if not written:
            self._update_signature(list(ret.operands))
            return
        first = len(ret.operands)
        results = list(ret.operands) + [self.current[a] for a in written]
        with ir.InsertionPoint(ret), ret.location:
            func.ReturnOp(results)
        ret.erase()
        arg_attrs = self._arg_attrs()
        for k, arg in enumerate(written):
            entries = {n.name: n.attr for n in arg_attrs[arg.arg_number]}
            entries[ALIASING_OUTPUT] = ir.IntegerAttr.get(ir.IntegerType.get_signless(32), first + k)
            arg_attrs[arg.arg_number] = ir.DictAttr.get(entries)
        self.fn.attributes["arg_attrs"] = ir.ArrayAttr.get(arg_attrs)
        self._update_signature(results)

    def _arg_attrs(self) -> list[ir.DictAttr]:
        n = len(self.fn.regions[0].blocks[0].arguments)
        if "arg_attrs" in self.fn.attributes:
            return [ir.DictAttr(a) for a in ir.ArrayAttr(self.fn.attributes["arg_attrs"])]
        return [ir.DictAttr.get({}) for _ in range(n)]

    def _update_signature(self, results: list[ir.Value]) -> None:
        args = [a.type for a in self.fn.regions[0].blocks[0].arguments]
        self.fn.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get(args, [r.type for r in results]))
