"""Parameters stay on the device between calls and are re-uploaded exactly when they
change (in-place update, `p.data = ...`)."""

import torch

from torch_tpu.program.invoker import RESIDENT_PARAMETERS


def test_parameters_upload_once_and_follow_changes(monkeypatch):
    torch._dynamo.reset()
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    compiled = torch.compile(model, backend="tpu")
    x = torch.randn(3, 8)
    uploads = []
    real_get = RESIDENT_PARAMETERS.get

    def counting_get(tensor, client):
        before = len(RESIDENT_PARAMETERS._entries), RESIDENT_PARAMETERS._entries.get(id(tensor))
        buffer = real_get(tensor, client)
        if before[1] is None or before[1][-1] is not buffer:
            uploads.append(tensor)
        return buffer

    monkeypatch.setattr(RESIDENT_PARAMETERS, "get", counting_get)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
        first = len(uploads)
        assert first == 4  # two weights, two biases
        torch.testing.assert_close(compiled(x), model(x))
        assert len(uploads) == first  # nothing changed: nothing re-uploaded

        model[0].weight.mul_(2.0)  # in-place: _version changes
        torch.testing.assert_close(compiled(x), model(x))
        assert len(uploads) == first + 1

        model[2].bias.data = torch.randn(4)  # new storage
        torch.testing.assert_close(compiled(x), model(x))
        assert len(uploads) == first + 2
