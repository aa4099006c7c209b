"""kiln's Python API with CUDA tensors, on a GPU (not in `make python`: no GPU there). On the GPU machine,
with the package importable:

    python3 -m pytest -q python/tests/gpu_dlpack.py

torch and CuPy tensors on the GPU go into a GPU engine where they lie and the outputs come back on the
GPU (torch tensors for torch inputs, DLPack arrays otherwise), equal to the numpy path's; a dynamic
engine's outputs take their shape from the inputs; a CPU engine refuses GPU tensors with a reason and
a shape outside a dynamic engine's range is the usual one-line error.
"""
import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import kiln

W0 = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
W1 = np.random.default_rng(1).standard_normal((8, 3)).astype(np.float32)


def mlp(path):
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w0"], ["h"]), helper.make_node("Relu", ["h"], ["a"]),
                           helper.make_node("MatMul", ["a", "w1"], ["y"])], "mlp",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
                          [numpy_helper.from_array(W0, "w0"), numpy_helper.from_array(W1, "w1")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return str(path)


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    d = tmp_path_factory.mktemp("dl")
    path = mlp(d / "mlp.onnx")
    return {"static": kiln.build(path, device="cuda", shapes={"x": [5, 4]}),
            "dynamic": kiln.build(path, device="cuda", shape_ranges={"x": [(1, 16), 4]}),
            "cpu": kiln.build(path, device="cpu", shapes={"x": [5, 4]})}


@pytest.mark.parametrize("kind,rows", [("static", 5), ("dynamic", 5), ("dynamic", 11)])
def test_torch_in_torch_out_on_the_gpu(engines, kind, rows):
    s = engines[kind].create_session()
    x = torch.randn(rows, 4, device="cuda")
    y, = s.run(None, {"x": x})
    assert isinstance(y, torch.Tensor) and y.is_cuda and tuple(y.shape) == (rows, 3)
    want, = s.run(None, {"x": x.cpu().numpy()})  # the host path
    np.testing.assert_allclose(y.cpu().numpy(), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(want, np.maximum(x.cpu().numpy() @ W0, 0) @ W1, rtol=1e-3, atol=1e-3)
    # The output is ordinary torch memory: it outlives the session and frees with the tensor.
    del s
    assert float((y * 2).sum()) == pytest.approx(float(want.sum()) * 2, rel=1e-4)


def test_cupy_in_dlpack_out(engines):
    cupy = pytest.importorskip("cupy")
    s = engines["dynamic"].create_session()
    x = cupy.asarray(np.random.default_rng(3).standard_normal((7, 4)).astype(np.float32))
    y, = s.run(None, {"x": x})
    assert not isinstance(y, torch.Tensor)
    got = cupy.from_dlpack(y)
    assert got.shape == (7, 3)
    want, = s.run(None, {"x": cupy.asnumpy(x)})
    np.testing.assert_allclose(cupy.asnumpy(got), want, rtol=1e-5, atol=1e-5)


def test_gpu_tensors_refused_with_a_reason(engines):
    x = torch.randn(5, 4, device="cuda")
    with pytest.raises(kiln.KilnError, match="is on the GPU, but this engine runs on the cpu"):
        engines["cpu"].create_session().run(None, {"x": x})
    with pytest.raises(kiln.KilnError, match="dimension 0 \\('N'\\) is 17, outside the engine's range 1..16"):
        engines["dynamic"].create_session().run(None, {"x": torch.randn(17, 4, device="cuda")})
