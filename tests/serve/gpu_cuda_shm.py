"""kiln serve's CUDA shared memory extension on a GPU, driven by tritonclient's own CUDA shared memory
helpers (cuda-python IPC handles). Not in `make serve` (no GPU there); on the GPU machine:

    KILN=/tmp/k/bin/kiln python3 -m pytest -q tests/serve/gpu_cuda_shm.py

A GPU model (batched, max_batch_size 8) reads its input where the client put it in device memory and
writes its output into the client's device region, over gRPC and over HTTP (raw KServe JSON naming the
regions); concurrent requests from device regions are batched (concatenated on the device) and each
answered in its own region, also under sustained load (batches queued on the GPU behind each other); a CPU model given a device region copies it to the host and answers the
same; status, unregister, and a handle of the wrong size are checked.
"""
import json
import os
import threading
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.utils.cuda_shared_memory as cudashm
from tritonclient.utils import InferenceServerException

from test_grpc import counters
import server_util
from test_http import KILN, mlp_ref, write_mlp

CONFIG = """
max_batch_size: 8
dynamic_batching { max_queue_delay_microseconds: 200000 preferred_batch_size: [ 4, 8 ] }
instance_group [ { count: 1 } ]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = str(tmp_path_factory.mktemp("cudashm"))
    for name, extra in (("mlp", ""), ("mlp_cpu", 'parameters { key: "device" value { string_value: "cpu" } }\n')):
        write_mlp(os.path.join(repo, name, "1", "model.onnx"), 1)
        with open(os.path.join(repo, name, "config.pbtxt"), "w") as f:
            f.write(CONFIG + extra)
    proc = server_util.start(KILN, repo, device="cuda", ready_model="mlp", timeout=180)
    yield proc
    print("kiln serve's log:\n" + server_util.stop(proc))


@pytest.fixture()
def regions():
    made = []

    def make(name, x_or_size):
        size = x_or_size if isinstance(x_or_size, int) else x_or_size.nbytes
        h = cudashm.create_shared_memory_region(name, size, 0)
        if not isinstance(x_or_size, int):
            cudashm.set_shared_memory_region(h, [x_or_size])
        made.append(h)
        return h
    yield make
    for h in made:
        cudashm.destroy_shared_memory_region(h)


def register(c, name, h, size):
    c.register_cuda_shared_memory(name, cudashm.get_raw_handle(h), 0, size)


@pytest.mark.parametrize("model", ["mlp", "mlp_cpu"])
def test_grpc_device_input_and_output(server, regions, model):
    c = tg.InferenceServerClient(server.grpc)
    x = np.random.default_rng(3).standard_normal((3, 4)).astype(np.float32)
    hin, hout = regions(f"in_{model}", x), regions(f"out_{model}", 3 * 3 * 4)
    register(c, f"in_{model}", hin, x.nbytes)
    register(c, f"out_{model}", hout, 36)
    try:
        i = tg.InferInput("x", [3, 4], "FP32")
        i.set_shared_memory(f"in_{model}", x.nbytes)
        o = tg.InferRequestedOutput("y")
        o.set_shared_memory(f"out_{model}", 36)
        c.infer(model, [i], outputs=[o])
        y = cudashm.get_contents_as_numpy(hout, np.float32, [3, 3])
        np.testing.assert_allclose(y, mlp_ref(x, 1), rtol=1e-4, atol=1e-4)
        st = c.get_cuda_shared_memory_status(as_json=True)["regions"]
        assert st[f"in_{model}"]["byte_size"] == str(x.nbytes)
    finally:
        c.unregister_cuda_shared_memory(f"in_{model}")
        c.unregister_cuda_shared_memory(f"out_{model}")


def test_http_raw_json_names_device_regions(server, regions):
    x = np.random.default_rng(4).standard_normal((2, 4)).astype(np.float32)
    hin, hout = regions("hin", x), regions("hout", 24)

    def post(path, body):
        req = urllib.request.Request(f"http://{server.http}{path}", data=json.dumps(body).encode(), method="POST")
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read() or b"{}")
    for name, h, size in (("hin", hin, x.nbytes), ("hout", hout, 24)):
        post(f"/v2/cudasharedmemory/region/{name}/register",
             {"raw_handle": {"b64": cudashm.get_raw_handle(h).decode()}, "device_id": 0, "byte_size": size})
    r = post("/v2/models/mlp/infer", {
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 4],
                    "parameters": {"shared_memory_region": "hin", "shared_memory_byte_size": x.nbytes}}],
        "outputs": [{"name": "y", "parameters": {"shared_memory_region": "hout", "shared_memory_byte_size": 24}}]})
    assert r["outputs"][0]["parameters"] == {"shared_memory_region": "hout", "shared_memory_byte_size": 24}
    np.testing.assert_allclose(cudashm.get_contents_as_numpy(hout, np.float32, [2, 3]), mlp_ref(x, 1), rtol=1e-4, atol=1e-4)
    post("/v2/cudasharedmemory/unregister", {})
    with urllib.request.urlopen(f"http://{server.http}/v2/cudasharedmemory/status", timeout=30) as s:
        assert json.loads(s.read()) == []


def test_concurrent_device_requests_are_batched_on_the_device(server, regions):
    rows = [1, 2, 1, 3, 1, 2, 2, 1]
    xs = [np.random.default_rng(60 + k).standard_normal((n, 4)).astype(np.float32) for k, n in enumerate(rows)]
    c = tg.InferenceServerClient(server.grpc)
    outs = []
    for k, x in enumerate(xs):
        register(c, f"i{k}", regions(f"i{k}", x), x.nbytes)
        outs.append(regions(f"o{k}", rows[k] * 12))
        register(c, f"o{k}", outs[-1], rows[k] * 12)
    before = counters(server, "mlp", 1)
    errors = []

    def work(k):
        try:
            i = tg.InferInput("x", list(xs[k].shape), "FP32")
            i.set_shared_memory(f"i{k}", xs[k].nbytes)
            o = tg.InferRequestedOutput("y")
            o.set_shared_memory(f"o{k}", rows[k] * 12)
            tg.InferenceServerClient(server.grpc).infer("mlp", [i], outputs=[o])
        except Exception as e:  # noqa: BLE001 - counted
            errors.append(repr(e))
    threads = [threading.Thread(target=work, args=(k,)) for k in range(len(rows))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    c.unregister_cuda_shared_memory()
    assert not errors, errors
    after = counters(server, "mlp", 1)
    assert after["nv_inference_count"] - before.get("nv_inference_count", 0) == sum(rows)
    assert after["nv_inference_exec_count"] - before.get("nv_inference_exec_count", 0) < len(rows)
    for k, x in enumerate(xs):
        np.testing.assert_allclose(cudashm.get_contents_as_numpy(outs[k], np.float32, [rows[k], 3]), mlp_ref(x, 1),
                                   rtol=1e-4, atol=1e-4)


def test_sustained_device_load_answers_each_request_in_its_region(server, regions):
    """16 clients, 25 requests each, new data every time: batches form back to back, each queued on
    the GPU (Session::enqueue) before the one before it is answered; every output must be its own
    request's, in its own region."""
    n, per = 16, 25
    c = tg.InferenceServerClient(server.grpc)
    hin, hout = [], []
    for k in range(n):
        hin.append(regions(f"si{k}", 2 * 16))
        hout.append(regions(f"so{k}", 2 * 12))
        register(c, f"si{k}", hin[k], 2 * 16)
        register(c, f"so{k}", hout[k], 2 * 12)
    before = counters(server, "mlp", 1)
    errors = []

    def work(k):
        rng = np.random.default_rng(100 + k)
        client = tg.InferenceServerClient(server.grpc)
        try:
            for _ in range(per):
                rows = int(rng.integers(1, 3))
                x = rng.standard_normal((rows, 4)).astype(np.float32)
                cudashm.set_shared_memory_region(hin[k], [x])
                i = tg.InferInput("x", [rows, 4], "FP32")
                i.set_shared_memory(f"si{k}", x.nbytes)
                o = tg.InferRequestedOutput("y")
                o.set_shared_memory(f"so{k}", rows * 12)
                client.infer("mlp", [i], outputs=[o])
                np.testing.assert_allclose(cudashm.get_contents_as_numpy(hout[k], np.float32, [rows, 3]), mlp_ref(x, 1),
                                           rtol=1e-4, atol=1e-4)
        except Exception as e:  # noqa: BLE001 - counted
            errors.append(repr(e))
    threads = [threading.Thread(target=work, args=(k,), daemon=True) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    c.unregister_cuda_shared_memory()
    assert not errors, errors[:3]
    after = counters(server, "mlp", 1)
    assert after["nv_inference_request_success"] - before.get("nv_inference_request_success", 0) == n * per
    assert after["nv_inference_exec_count"] - before.get("nv_inference_exec_count", 0) < n * per


def test_bad_handle_is_refused(server):
    c = tg.InferenceServerClient(server.grpc)
    import base64
    with pytest.raises(InferenceServerException, match="raw_handle has 10 bytes; a CUDA IPC handle has 64"):
        c.register_cuda_shared_memory("short", base64.b64encode(bytes(10)), 0, 64)
    with pytest.raises(InferenceServerException, match="cannot open its IPC handle"):
        c.register_cuda_shared_memory("zeros", base64.b64encode(bytes(64)), 0, 64)
