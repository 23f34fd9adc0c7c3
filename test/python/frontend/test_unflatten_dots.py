"""torchtpu-unflatten-dots on what PyTorch hands the compiler: `nn.Linear` layers on a
(batch, seq, features) input, forward and backward, compute what eager computes, and their
products no longer read rows flattened by a reshape (the pass's lit tests hold each case
of the rewrite)."""

import re

import torch

_OP = re.compile(r"^\s*(%\w+) = stablehlo\.(\w+) (%\w+)(?:, (%\w+))?.*: \(tensor<([0-9x]+)x\w+>(?:, [^)]*)?\) -> tensor<([0-9x]+)x")


def _products_of_flattened_rows(text: str) -> list[str]:
    """The dot_generals of `text` that read (through a transpose) a reshape of a rank >= 3
    tensor to 2-D: what the pass rewrites."""
    flattened, transposed, found = set(), {}, []
    for line in text.splitlines():
        m = _OP.match(line)
        if not m:
            continue
        name, op, first, second, operand_dims, result_dims = m.groups()
        if op == "reshape" and operand_dims.count("x") >= 2 and result_dims.count("x") == 1:
            flattened.add(name)
        elif op == "transpose":
            transposed[name] = first
        elif op == "dot_general" and any(transposed.get(v, v) in flattened for v in (first, second)):
            found.append(line.strip())
    return found


def _two_linears():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 24), torch.nn.GELU(), torch.nn.Linear(24, 8))


def test_linear_forward_and_backward_match_eager_and_contract_over_batch_and_seq(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_TPU_DUMP_DIR", str(tmp_path))
    torch._dynamo.reset()
    eager, compiled_model = _two_linears(), _two_linears()
    x = torch.randn(3, 5, 16)
    x_eager, x_compiled = x.clone().requires_grad_(), x.clone().requires_grad_()

    eager(x_eager).square().sum().backward()
    torch.compile(compiled_model, backend="tpu")(x_compiled).square().sum().backward()

    torch.testing.assert_close(x_compiled.grad, x_eager.grad, rtol=1e-5, atol=1e-5)
    for (name, p), q in zip(compiled_model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-5, msg=name)

    backward = [d for d in tmp_path.iterdir() if d.is_dir() and "-backward-" in d.name]
    assert len(backward) == 1, sorted(d.name for d in tmp_path.iterdir())
    final = (backward[0] / "final.mlir").read_text()
    # The weight gradients contract over (batch, seq); the input gradients keep them apart.
    assert final.count("contracting_dims = [0, 1] x [0, 1]") == 2, final
    assert not _products_of_flattened_rows(final), final
    forward = [d for d in tmp_path.iterdir() if d.is_dir() and "-forward-" in d.name]
    assert "contracting_dims = [2] x [0]" in (forward[0] / "final.mlir").read_text()
