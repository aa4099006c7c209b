"""kiln serve's shared memory extensions, driven by tritonclient's own shared memory helpers (`make serve`).

System shared memory (POSIX objects) over HTTP and gRPC: inputs read from a region and outputs written
into one, at offsets; regions registered over one protocol used over the other; status and unregister;
concurrent requests from regions batched and each answered in its own region; every misuse (an unknown
region, a range past its end, a size that does not match, an output region too small, a taken name, a
missing key) a one-line error naming what was wrong. CUDA regions are checked on a GPU by
tests/serve/gpu_cuda_shm.py; here a server without a GPU refuses them with a reason.
"""
import base64
import os
import shutil
import threading

import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from test_grpc import counters
import server_util
from test_http import KILN, MODEL_DIR, mlp_ref, write_mlp

MLP_CONFIG = """
max_batch_size: 8
dynamic_batching { max_queue_delay_microseconds: 200000 preferred_batch_size: [ 4, 8 ] }
instance_group [ { count: 1 } ]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = str(tmp_path_factory.mktemp("shmrepo"))
    write_mlp(os.path.join(repo, "mlp", "1", "model.onnx"), 1)
    with open(os.path.join(repo, "mlp", "config.pbtxt"), "w") as f:
        f.write(MLP_CONFIG)
    os.makedirs(os.path.join(repo, "effnet", "1"))
    shutil.copy(os.path.join(MODEL_DIR, "model.onnx"), os.path.join(repo, "effnet", "1", "model.onnx"))
    proc = server_util.start(KILN, repo)
    yield proc
    server_util.stop(proc)


@pytest.fixture()
def region():
    """Makes system shared memory objects for a test and destroys them after it."""
    made = []

    def make(name, size):
        h = shm.create_shared_memory_region(name, f"/kiln_test_{os.getpid()}_{name}", size)
        made.append(h)
        return h
    yield make
    for h in made:
        shm.destroy_shared_memory_region(h)


def clients(server):
    return th.InferenceServerClient(server.http), tg.InferenceServerClient(server.grpc)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_inputs_and_outputs_in_regions(server, region, protocol):
    http, grpc = clients(server)
    c, mod = (http, th) if protocol == "http" else (grpc, tg)
    x = np.random.default_rng(7).standard_normal((3, 4)).astype(np.float32)
    # One region for both tensors; the input at an offset that is not a page boundary.
    h = region(f"io_{protocol}", 4096)
    shm.set_shared_memory_region(h, [x], offset=100)
    c.register_system_shared_memory(f"io_{protocol}", f"/kiln_test_{os.getpid()}_io_{protocol}", 4096)
    try:
        i = mod.InferInput("x", [3, 4], "FP32")
        i.set_shared_memory(f"io_{protocol}", x.nbytes, offset=100)
        o = mod.InferRequestedOutput("y")
        o.set_shared_memory(f"io_{protocol}", 3 * 3 * 4, offset=1000)
        r = c.infer("mlp", [i], outputs=[o])
        out = r.get_output("y")
        params = out["parameters"] if protocol == "http" else {k: v for k, v in out.parameters.items()}
        assert (params["shared_memory_region"] if protocol == "http" else params["shared_memory_region"].string_param) \
            == f"io_{protocol}"
        y = shm.get_contents_as_numpy(h, np.float32, [3, 3], offset=1000)
        np.testing.assert_allclose(y, mlp_ref(x, 1), rtol=1e-5, atol=1e-5)
        # The input is left as it was.
        np.testing.assert_array_equal(shm.get_contents_as_numpy(h, np.float32, [3, 4], offset=100), x)
    finally:
        c.unregister_system_shared_memory(f"io_{protocol}")


def test_region_of_one_protocol_serves_the_other_and_status(server, region):
    http, grpc = clients(server)
    key = f"/kiln_test_{os.getpid()}_shared"
    h = region("shared", 1 << 20)
    x = np.load(os.path.join(MODEL_DIR, "chelsea.npy"))
    want = np.load(os.path.join(MODEL_DIR, "chelsea_expected_logits.npy"))
    shm.set_shared_memory_region(h, [x])
    http.register_system_shared_memory("shared", key, 1 << 20)
    try:
        st = http.get_system_shared_memory_status("shared")
        assert st == [{"name": "shared", "key": key, "offset": 0, "byte_size": 1 << 20}]
        gst = grpc.get_system_shared_memory_status(as_json=True)
        assert gst["regions"]["shared"]["key"] == key and gst["regions"]["shared"]["byte_size"] == str(1 << 20)
        i = tg.InferInput("input", list(x.shape), "FP32")
        i.set_shared_memory("shared", x.nbytes)  # EfficientNet's 602 KB image read where it lies
        r = grpc.infer("effnet", [i])
        np.testing.assert_allclose(r.as_numpy("logits"), want, rtol=1e-3, atol=1e-3)
    finally:
        grpc.unregister_system_shared_memory("shared")
    assert http.get_system_shared_memory_status() == []
    with pytest.raises(InferenceServerException, match="no system shared memory region 'shared' is registered"):
        http.get_system_shared_memory_status("shared")


def test_concurrent_requests_from_regions_are_batched(server, region):
    http, _ = clients(server)
    rows = [1, 2, 1, 3, 1, 2, 2, 1]
    key = f"/kiln_test_{os.getpid()}_many"
    h = region("many", 1 << 16)
    xs, at = [], 0
    for k, n in enumerate(rows):
        xs.append(np.random.default_rng(50 + k).standard_normal((n, 4)).astype(np.float32))
    offsets = []
    for x in xs:
        offsets.append(at)
        shm.set_shared_memory_region(h, [x], offset=at)
        at += 256
    http.register_system_shared_memory("many", key, 1 << 16)
    before = counters(server, "mlp", 1)
    results, errors = {}, []

    def work(k):
        try:
            c = tg.InferenceServerClient(server.grpc)
            i = tg.InferInput("x", list(xs[k].shape), "FP32")
            i.set_shared_memory("many", xs[k].nbytes, offset=offsets[k])
            o = tg.InferRequestedOutput("y")
            o.set_shared_memory("many", rows[k] * 12, offset=(1 << 15) + offsets[k])
            c.infer("mlp", [i], outputs=[o])
            results[k] = True
        except Exception as e:  # noqa: BLE001 - counted
            errors.append(repr(e))
    try:
        threads = [threading.Thread(target=work, args=(k,)) for k in range(len(rows))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        after = counters(server, "mlp", 1)
        assert after["nv_inference_count"] - before["nv_inference_count"] == sum(rows)
        assert after["nv_inference_exec_count"] - before["nv_inference_exec_count"] < len(rows)  # some ran together
        for k, x in enumerate(xs):
            y = shm.get_contents_as_numpy(h, np.float32, [rows[k], 3], offset=(1 << 15) + offsets[k])
            np.testing.assert_allclose(y, mlp_ref(x, 1), rtol=1e-5, atol=1e-5)
    finally:
        http.unregister_system_shared_memory("many")


def test_misuse_is_a_clear_error(server, region):
    http, grpc = clients(server)
    key = f"/kiln_test_{os.getpid()}_bad"
    h = region("bad", 256)
    x = np.ones((2, 4), np.float32)
    shm.set_shared_memory_region(h, [x])
    with pytest.raises(InferenceServerException, match="cannot open the shared memory object"):
        http.register_system_shared_memory("nokey", "/kiln_test_no_such_key", 64)
    with pytest.raises(InferenceServerException, match="past the object's 256 bytes"):
        http.register_system_shared_memory("big", key, 512)
    http.register_system_shared_memory("bad", key, 256)
    try:
        with pytest.raises(InferenceServerException, match="'bad' is already registered"):
            grpc.register_system_shared_memory("bad", key, 256)

        def infer(size, offset=0, out=None, name="bad"):
            i = th.InferInput("x", [2, 4], "FP32")
            i.set_shared_memory(name, size, offset=offset)
            outs = None
            if out:
                o = th.InferRequestedOutput("y")
                o.set_shared_memory("bad", out[0], offset=out[1])
                outs = [o]
            return http.infer("mlp", [i], outputs=outs)
        with pytest.raises(InferenceServerException, match="input 'x': no shared memory region 'nope' is registered"):
            infer(32, name="nope")
        with pytest.raises(InferenceServerException, match="shared_memory_byte_size is 24 bytes, shape and datatype need 32"):
            infer(24)
        with pytest.raises(InferenceServerException, match="is past region 'bad''s 256 bytes"):
            infer(32, offset=240)
        with pytest.raises(InferenceServerException, match="output 'y' needs 24 bytes; shared_memory_byte_size is 16"):
            infer(32, out=(16, 128))
        r = infer(32, out=(24, 128))  # and it still serves
        np.testing.assert_allclose(shm.get_contents_as_numpy(h, np.float32, [2, 3], offset=128), mlp_ref(x, 1),
                                   rtol=1e-5, atol=1e-5)
        assert r.get_output("y")["parameters"]["shared_memory_byte_size"] == 24
        # gRPC says the same.
        i = tg.InferInput("x", [2, 4], "FP32")
        i.set_shared_memory("bad", 24)
        with pytest.raises(InferenceServerException, match="shape and datatype need 32"):
            grpc.infer("mlp", [i])
    finally:
        http.unregister_system_shared_memory("bad")
    with pytest.raises(InferenceServerException, match="no system shared memory region 'bad' is registered"):
        grpc.unregister_system_shared_memory("bad")


def test_cuda_regions_need_a_gpu_and_a_real_handle(server):
    http, grpc = clients(server)
    assert "system_shared_memory" in http.get_server_metadata()["extensions"]
    handle = base64.b64encode(bytes(64))
    with pytest.raises(InferenceServerException, match="CUDA shared memory region 'gpu'"):
        http.register_cuda_shared_memory("gpu", handle, 0, 1024)
    with pytest.raises(InferenceServerException, match="CUDA shared memory region 'gpu'"):
        grpc.register_cuda_shared_memory("gpu", handle, 0, 1024)
    assert http.get_cuda_shared_memory_status() == []
