"""The Python package over the C++ API (`make python`): the bundled EfficientNet-Lite0 on the CPU,
engine files, errors as kiln.KilnError, DLPack inputs, threads, dynamic shapes and quantize."""
import os
import threading
import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MODEL_DIR = os.path.join(REPO, "models", "efficientnet-lite0")
MODEL = os.path.join(MODEL_DIR, "model.onnx")


@pytest.fixture(scope="module")
def engine():
    return kiln.build(MODEL, device="cpu")


def chelsea():
    return np.load(os.path.join(MODEL_DIR, "chelsea.npy"))


def test_metadata(engine):
    assert engine.device == "cpu"
    assert [i.name for i in engine.inputs] == ["input"]
    assert engine.inputs[0].dtype == "float32" and engine.inputs[0].shape == [1, 3, 224, 224]
    assert engine.outputs[0].name == "logits" and engine.outputs[0].shape == [1, 1000]
    assert "Conv" in engine.report()


def test_run_matches_onnxruntime_logits(engine):
    s = engine.create_session()
    out = s.run(None, {"input": chelsea()})
    want = np.load(os.path.join(MODEL_DIR, "chelsea_expected_logits.npy"))
    assert isinstance(out, list) and len(out) == 1
    assert out[0].dtype == np.float32 and out[0].shape == (1, 1000)
    np.testing.assert_allclose(out[0], want, rtol=1e-3, atol=1e-4)
    assert int(out[0].argmax()) == int(want.argmax())
    named, = s.run(["logits"], {"input": chelsea()})
    np.testing.assert_array_equal(named, out[0])


def test_errors_are_kiln_errors(engine):
    s = engine.create_session()
    with pytest.raises(kiln.KilnError, match="'pixels' is not an input"):
        s.run(None, {"pixels": chelsea()})
    with pytest.raises(kiln.KilnError, match="input 'input'"):
        s.run(None, {"input": chelsea().astype(np.float64)})
    with pytest.raises(kiln.KilnError, match="input 'input'"):
        s.run(None, {"input": np.zeros((1, 3, 224, 225), np.float32)})
    with pytest.raises(kiln.KilnError, match="'probs' is not an output"):
        s.run(["probs"], {"input": chelsea()})
    # The session keeps working after errors.
    assert s.run(None, {"input": chelsea()})[0].shape == (1, 1000)
    with pytest.raises(kiln.KilnError, match="nosuch.onnx"):
        kiln.build(os.path.join(REPO, "nosuch.onnx"), device="cpu")
    with pytest.raises(kiln.KilnError, match="device is"):
        kiln.build(MODEL, device="tpu")
    assert issubclass(kiln.KilnError, RuntimeError)


def test_engine_file_round_trip(engine, tmp_path):
    path = tmp_path / "m.kiln"
    engine.save(path)
    loaded = kiln.Engine.load(path)
    assert loaded.inputs == engine.inputs and loaded.outputs == engine.outputs
    a = engine.create_session().run(None, {"input": chelsea()})[0]
    b = loaded.create_session().run(None, {"input": chelsea()})[0]
    np.testing.assert_array_equal(a, b)
    (tmp_path / "bad.kiln").write_bytes(path.read_bytes()[:1000])
    with pytest.raises(kiln.KilnError, match="bad.kiln"):
        kiln.Engine.load(tmp_path / "bad.kiln")


class DLPackOnly:
    """A tensor that offers only the DLPack protocol (as torch and jax tensors do)."""

    def __init__(self, a):
        self._a = a

    def __dlpack__(self, *args, **kwargs):
        return self._a.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


def test_dlpack_and_lists(engine):
    s = engine.create_session()
    x = chelsea()
    want = s.run(None, {"input": x})[0]
    np.testing.assert_array_equal(s.run(None, {"input": DLPackOnly(x)})[0], want)
    np.testing.assert_array_equal(s.run(None, {"input": x.tolist()})[0], want)  # converted to the input's dtype
    # A non-contiguous view is made contiguous, not read with the wrong strides.
    big = np.zeros((1, 3, 224, 448), np.float32)
    big[..., ::2] = x
    np.testing.assert_array_equal(s.run(None, {"input": big[..., ::2]})[0], want)


def test_gil_released_while_running(engine):
    """A Python thread keeps running while kiln runs a forward in another."""
    s = engine.create_session()
    x = chelsea()
    ticks, done = [0], threading.Event()

    def count():
        while not done.is_set():
            ticks[0] += 1
            time.sleep(0.0005)
    t = threading.Thread(target=count)
    t.start()
    start, runs, t0 = ticks[0], 0, time.perf_counter()
    while time.perf_counter() - t0 < 0.2:  # forwards back to back for 200 ms, however fast each is
        s.run(None, {"input": x})
        runs += 1
    done.set()
    t.join()
    # Held, the GIL would let the counter tick about once between two forwards; released, it ticks
    # every ~0.5 ms while they run.
    assert ticks[0] - start > 3 * runs + 20, (
        f"the counting thread was starved ({ticks[0] - start} ticks over {runs} forwards): the GIL is held while kiln runs")


def test_sessions_in_threads(engine):
    x = chelsea()
    want = engine.create_session().run(None, {"input": x})[0]
    results = [None] * 3

    def work(i):
        results[i] = engine.create_session().run(None, {"input": x})[0]
    threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in results:
        np.testing.assert_array_equal(r, want)


def mlp(path, batch="N"):
    rng = np.random.default_rng(0)
    w0, w1 = rng.standard_normal((4, 8)).astype(np.float32), rng.standard_normal((8, 3)).astype(np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w0"], ["h"]), helper.make_node("Relu", ["h"], ["a"]),
                           helper.make_node("MatMul", ["a", "w1"], ["y"])], "mlp",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 3])],
                          [numpy_helper.from_array(w0, "w0"), numpy_helper.from_array(w1, "w1")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return w0, w1


def test_shape_ranges(tmp_path):
    path = str(tmp_path / "mlp.onnx")
    w0, w1 = mlp(path)
    e = kiln.build(path, device="cpu", shape_ranges={"x": [(1, 8), 4]})
    assert e.inputs[0].shape == [None, 4] and e.inputs[0].min_shape[0] == 1 and e.inputs[0].max_shape[0] == 8
    s = e.create_session()
    for n in (1, 5, 8):
        x = np.random.default_rng(n).standard_normal((n, 4)).astype(np.float32)
        y, = s.run(None, {"x": x})
        np.testing.assert_allclose(y, np.maximum(x @ w0, 0) @ w1, rtol=1e-5, atol=1e-5)
    with pytest.raises(kiln.KilnError, match="1..8"):
        s.run(None, {"x": np.zeros((9, 4), np.float32)})
    static = kiln.build(path, device="cpu", shapes={"x": [2, 4]})
    assert static.inputs[0].shape == [2, 4]
    # Warm shapes are within ranges (a GPU engine plans them ahead; the CPU's take them as any shape).
    warm = kiln.build(path, device="cpu", shape_ranges={"x": [(1, 8), 4]}, warm_shapes=[{"x": [5, 4]}])
    y, = warm.create_session().run(None, {"x": np.ones((5, 4), np.float32)})
    np.testing.assert_allclose(y, np.maximum(np.ones((5, 4)) @ w0, 0) @ w1, rtol=1e-5, atol=1e-5)
    with pytest.raises(kiln.KilnError, match="warm shapes need shape ranges"):
        kiln.build(path, device="cpu", shapes={"x": [2, 4]}, warm_shapes=[{"x": [2, 4]}])


def test_quantize(tmp_path):
    path = str(tmp_path / "mlp.onnx")
    mlp(path)
    calib = tmp_path / "calib"
    calib.mkdir()
    np.save(calib / "x.npy", np.random.default_rng(1).standard_normal((16, 1, 4)).astype(np.float32))
    out = tmp_path / "q.onnx"
    text, report = kiln.quantize(path, out, calib_dir=str(calib), method="minmax", quantize_sensitive=True)
    assert out.exists() and "int8" in text
    assert sum(l["quantized"] for l in report["layers"]) == 2
    y, = kiln.build(out, device="cpu").create_session().run(None, {"x": np.ones((1, 4), np.float32)})
    assert y.shape == (1, 3) and np.isfinite(y).all()
    (tmp_path / "empty").mkdir()
    with pytest.raises(kiln.KilnError, match="empty: no samples"):
        kiln.quantize(path, tmp_path / "q2.onnx", calib_dir=str(tmp_path / "empty"))


def test_tensor_parallel(tmp_path):
    # Two CPU ranks: w0's columns and w1's rows split, joined by the reference all-reduce.
    path = str(tmp_path / "mlp.onnx")
    w0, w1 = mlp(path)
    e = kiln.build(path, device="cpu", shapes={"x": [2, 4]}, tensor_parallel=2)
    x = np.random.default_rng(3).standard_normal((2, 4)).astype(np.float32)
    y, = e.create_session().run(None, {"x": x})
    np.testing.assert_allclose(y, np.maximum(x @ w0, 0) @ w1, rtol=1e-5, atol=1e-5)
    e.save(str(tmp_path / "mlp.tp2.kiln"))
    y2, = kiln.Engine.load(str(tmp_path / "mlp.tp2.kiln")).create_session().run(None, {"x": x})
    np.testing.assert_array_equal(y, y2)
    with pytest.raises(kiln.KilnError, match="fixed input shapes"):
        kiln.build(path, device="cpu", tensor_parallel=2)
    # A batch of 4 as 2 micro-batches of 2 rows (asked for: the default keeps one batch this small).
    x4 = np.random.default_rng(4).standard_normal((4, 4)).astype(np.float32)
    e = kiln.build(path, device="cpu", batch=4, tensor_parallel=2, micro_batches=2)
    assert "micro-batches: 2 of 2 rows" in e.report()
    y, = e.create_session().run(None, {"x": x4})
    np.testing.assert_allclose(y, np.maximum(x4 @ w0, 0) @ w1, rtol=1e-5, atol=1e-5)
    with pytest.raises(kiln.KilnError, match="input 'x'"):  # 3 rows: never a silent partial batch
        e.create_session().run(None, {"x": x4[:3]})
    assert "micro-batches: 1 (" in kiln.build(path, device="cpu", batch=4, tensor_parallel=2).report()
    with pytest.raises(kiln.KilnError, match="does not divide into 3"):
        kiln.build(path, device="cpu", batch=4, tensor_parallel=2, micro_batches=3)


def test_deterministic(tmp_path):
    path = str(tmp_path / "mlp.onnx")
    mlp(path)
    e = kiln.build(path, device="cpu", shapes={"x": [2, 4]}, deterministic=True)
    assert "deterministic: yes" in e.report()
    e.save(str(tmp_path / "det.kiln"))
    assert "deterministic: yes" in kiln.Engine.load(str(tmp_path / "det.kiln")).report()
    assert "deterministic" not in kiln.build(path, device="cpu", shapes={"x": [2, 4]}).report()


def test_edge_target(tmp_path):
    path = str(tmp_path / "mlp.onnx")
    mlp(path)
    e = kiln.build(path, target="edge", memory_budget_mib=1)
    assert e.device == "cpu" and e.inputs[0].shape == [1, 4]
    assert "target: edge" in e.report() and "memory per session:" in e.report()
    with pytest.raises(kiln.KilnError, match="target is 'server' or 'edge'"):
        kiln.build(path, target="phone")


def aligned(shape, align=64):
    """A float32 array whose data starts on an `align`-byte boundary (numpy's own may not)."""
    n = int(np.prod(shape))
    raw = np.empty(n * 4 + align, np.uint8)
    off = (-raw.ctypes.data) % align
    return raw[off:off + n * 4].view(np.float32).reshape(shape)


@pytest.mark.parametrize("device", ["cpu", "cpu-ref"])
def test_large_aligned_inputs_read_in_place_and_left_alone(tmp_path, device):
    """Inputs of 64 KiB and more on a 64-byte boundary are read in place: the results are right, the
    input is not written, and an output that is the input itself gets memory of its own."""
    path = str(tmp_path / "id_relu.onnx")
    g = helper.make_graph([helper.make_node("Identity", ["x"], ["same"]), helper.make_node("Relu", ["x"], ["r"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 1024])],
                          [helper.make_tensor_value_info("same", TensorProto.FLOAT, [64, 1024]),
                           helper.make_tensor_value_info("r", TensorProto.FLOAT, [64, 1024])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    s = kiln.build(path, device=device).create_session()
    x = aligned((64, 1024))
    assert x.ctypes.data % 64 == 0 and x.nbytes >= 64 << 10
    x[...] = np.random.default_rng(4).standard_normal(x.shape)
    before = x.copy()
    same, r = s.run(None, {"x": x})
    np.testing.assert_array_equal(x, before)
    np.testing.assert_array_equal(same, before)
    np.testing.assert_array_equal(r, np.maximum(before, 0))
    x[...] = 7.0  # the caller reuses its buffer: the outputs it was given do not change
    np.testing.assert_array_equal(same, before)
    np.testing.assert_array_equal(r, np.maximum(before, 0))
