"""The torch wrapper's device path (torch ops on the gradient's device) sends the bytes the
numpy path sends, and moves only the selected values and positions to the host."""
import numpy as np
import pytest

# torch.nn, not torch: without PyTorch, this checkout's torch/ (the jobs folder) imports as
# a namespace package
pytest.importorskip("torch.nn")
import torch  # noqa: E402

import deepreduce_hvd as dr  # noqa: E402
from deepreduce_hvd.adapters import torch_device  # noqa: E402
from deepreduce_hvd.adapters.torch_device import DevicePath  # noqa: E402

pytestmark = pytest.mark.torch
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def strip(frame):
    return frame[:13] + frame[21:]  # without the two timings


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("config", [dict(sparsifier="topk", ratio=0.01),
                                    dict(sparsifier="topk", ratio=0.2, index="entropy", value="entropy"),
                                    dict(sparsifier="threshold", threshold=0.5, index="golomb", value="fp16"),
                                    dict(sparsifier="topk", ratio=0.05, memory=None),
                                    dict(sparsifier="topk", ratio=0.01, warmup_steps=3)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_same_bytes_as_the_host_path(device, config, dtype):
    config = {"index": "golomb", "value": "raw", **config}
    host, on_device = dr.Pipeline(**config), dr.Pipeline(**config)
    path, gen = DevicePath(on_device), torch.Generator().manual_seed(0)
    for step in range(4):  # the residual carries over between steps
        grad = (torch.randn(256, 300, generator=gen) * (1 + step)).to(dtype)
        grad[0, :7] = grad[0, 7]  # ties at the boundary are broken by position on both paths
        count = host.selection_count(grad.numel(), "w") if config["sparsifier"] == "topk" else None
        before = torch_device.COPIED["elements"]
        frame = path.compress("w", grad.to(device))
        moved = torch_device.COPIED["elements"] - before
        assert strip(frame) == strip(host.compress("w", grad.numpy()))
        if count is not None:
            assert moved == 2 * count  # values and positions, nothing dense
    if config.get("memory", "residual"):
        np.testing.assert_array_equal(on_device.memory.residual("w").cpu().numpy(),
                                      host.memory.residual("w"))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("half", [False, True])
def test_dense_allreduce_tensor_matches_the_host_path(device, half):
    host, on_device = dr.Pipeline(), dr.Pipeline()
    path, gen = DevicePath(on_device), torch.Generator().manual_seed(1)
    for _ in range(3):
        grad = torch.randn(500, generator=gen)
        sent = path.compress_dense("b", grad.to(device), half)
        assert sent.device.type == device
        np.testing.assert_array_equal(sent.cpu().numpy(), host.compress_dense("b", grad.numpy(), half))
    np.testing.assert_array_equal(on_device.memory.residual("b").cpu().numpy(), host.memory.residual("b"))


def test_nonfinite_gradient_resets_the_residual():
    pipeline = dr.Pipeline(index="golomb", value="raw")
    path = DevicePath(pipeline)
    path.compress("w", torch.randn(2000))
    grad = torch.randn(2000)
    grad[5] = float("nan")
    frame = path.compress("w", grad)
    got, _ = pipeline.decompress(frame, (2000,), "float32", 1)
    assert np.isnan(got).all() and pipeline.memory.residual("w") is None


def test_momentum_is_read_from_the_optimizer():
    from deepreduce_hvd.torch import DeepReduce
    model = torch.nn.Linear(4, 3)
    compression = DeepReduce().name_parameters(
        model.named_parameters(), optimizer=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.8))
    assert compression.pipeline.momentum.momentum == 0.8
    assert compression.pipeline.get_config()["momentum"] == 0.8
    for wrong in (torch.optim.Adam(model.parameters()),
                  torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True),
                  torch.optim.SGD([{"params": [model.weight], "momentum": 0.9},
                                   {"params": [model.bias], "momentum": 0.5}], lr=0.1)):
        with pytest.raises(dr.DeepReduceError):
            DeepReduce().name_parameters(model.named_parameters(), optimizer=wrong)
