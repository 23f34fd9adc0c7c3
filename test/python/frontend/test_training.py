"""Training through backend="tpu": 20 steps of SGD/AdamW follow eager's loss curve."""

import copy

import pytest
import torch
import torch.nn.functional as F
from models import SmallCNN, mlp, tiny_gpt


def _train(model, make_batch, loss_fn, optimizer_cls, steps, compile_model):
    torch.manual_seed(0)
    model = copy.deepcopy(model)
    step_model = torch.compile(model, backend="tpu") if compile_model else model
    optimizer = optimizer_cls(model.parameters())
    losses = []
    for step in range(steps):
        x, y = make_batch(step)
        optimizer.zero_grad()
        loss = loss_fn(step_model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def _batches(shape, classes, dtype=torch.float32):
    generator = torch.Generator().manual_seed(1)
    data = [(torch.randn(shape, generator=generator) if dtype.is_floating_point
             else torch.randint(0, classes, shape, generator=generator),
             torch.randint(0, classes, (shape[0],) if dtype.is_floating_point else shape, generator=generator))
            for _ in range(4)]
    return lambda step: data[step % len(data)]


CASES = {
    "mlp-sgd": (lambda: mlp(), _batches((8, 16), 10), F.cross_entropy,
                lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)),
    "cnn-adamw": (lambda: SmallCNN(), _batches((4, 3, 8, 8), 10), F.cross_entropy,
                  lambda p: torch.optim.AdamW(p, lr=1e-2)),
    "gpt-adamw": (lambda: tiny_gpt(), _batches((2, 16), 64, torch.int64),
                  lambda logits, y: F.cross_entropy(logits.flatten(0, 1), y.flatten()),
                  lambda p: torch.optim.AdamW(p, lr=3e-3)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_loss_curve_matches_eager(case):
    build, batches, loss_fn, optimizer = CASES[case]
    torch.manual_seed(0)
    model = build()
    eager = _train(model, batches, loss_fn, optimizer, 20, compile_model=False)
    ours = _train(model, batches, loss_fn, optimizer, 20, compile_model=True)
    assert eager[-1] < eager[0], "the reference run should learn"
    torch.testing.assert_close(torch.tensor(ours), torch.tensor(eager), rtol=2e-3, atol=2e-4)
