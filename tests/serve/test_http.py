"""kiln serve over HTTP, driven by tritonclient (`make serve`; KILN=path/to/kiln).

Prometheus metrics with Triton's names. A repository with the bundled EfficientNet-Lite0 (version 1, model.onnx built at load) and an MLP with
two versions (version 2 served). Every endpoint; JSON and binary tensors against known outputs;
repository index/unload/load, a failed load leaving the serving version; malformed requests answered
4xx while the server keeps serving; 64 concurrent requests all answered; SIGTERM draining requests in
flight and exiting 0.
"""
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import onnx
import pytest
import tritonclient.http as th
from onnx import TensorProto, helper, numpy_helper
from tritonclient.utils import InferenceServerException

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MODEL_DIR = os.path.join(REPO, "models", "efficientnet-lite0")
KILN = os.environ.get("KILN", os.path.join(REPO, "build", "kiln"))


def mlp_weights(version):
    rng = np.random.default_rng(version)
    return rng.standard_normal((4, 8)).astype(np.float32), rng.standard_normal((8, 3)).astype(np.float32)


def write_mlp(path, version):
    w0, w1 = mlp_weights(version)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w0"], ["h"]), helper.make_node("Relu", ["h"], ["a"]),
                           helper.make_node("MatMul", ["a", "w1"], ["y"])], "mlp",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
                          [numpy_helper.from_array(w0, "w0"), numpy_helper.from_array(w1, "w1")])
    os.makedirs(os.path.dirname(path), exist_ok=True)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)


def mlp_ref(x, version):
    w0, w1 = mlp_weights(version)
    return np.maximum(x @ w0, 0) @ w1


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, repo):
        self.port, self.metrics_port = free_port(), free_port()
        self.proc = subprocess.Popen([KILN, "serve", "--model-repository", repo, "--http-port", str(self.port),
                                      "--metrics-port", str(self.metrics_port),
                                      "--host", "127.0.0.1", "--device", "cpu", "--sessions", "2"],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.url = f"127.0.0.1:{self.port}"
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                if th.InferenceServerClient(self.url).is_server_ready():
                    return
            except Exception:  # noqa: BLE001 - not up yet
                time.sleep(0.2)
            if self.proc.poll() is not None:
                raise RuntimeError("kiln serve exited: " + self.proc.stdout.read())
        raise RuntimeError("kiln serve did not become ready")

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=60)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = str(tmp_path_factory.mktemp("repo"))
    os.makedirs(os.path.join(repo, "effnet", "1"))
    shutil.copy(os.path.join(MODEL_DIR, "model.onnx"), os.path.join(repo, "effnet", "1", "model.onnx"))
    write_mlp(os.path.join(repo, "mlp", "1", "model.onnx"), 1)
    write_mlp(os.path.join(repo, "mlp", "2", "model.onnx"), 2)
    with open(os.path.join(repo, "mlp", "config.pbtxt"), "w") as f:  # dim 0 is the batch: rows are counted
        f.write("max_batch_size: 8\ndynamic_batching { max_queue_delay_microseconds: 1000 }\n")
    s = Server(repo)
    s.repo = repo
    yield s
    if s.proc.poll() is None:
        s.stop()


def raw(server, method, path, body=b"", headers=None):
    req = urllib.request.Request(f"http://{server.url}{path}", data=body if method == "POST" else None, method=method,
                                 headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def infer_effnet(client, x, binary):
    i = th.InferInput("input", list(x.shape), "FP32")
    i.set_data_from_numpy(x, binary_data=binary)
    r = client.infer("effnet", [i], outputs=[th.InferRequestedOutput("logits", binary_data=binary)])
    return r.as_numpy("logits")


def test_health_and_metadata(server):
    c = th.InferenceServerClient(server.url)
    assert c.is_server_live() and c.is_server_ready()
    assert c.get_server_metadata()["name"] == "kiln"
    assert c.is_model_ready("effnet") and c.is_model_ready("mlp") and not c.is_model_ready("nope")
    m = c.get_model_metadata("effnet")
    assert m["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [1, 3, 224, 224]}]
    assert m["outputs"][0]["name"] == "logits" and m["versions"] == ["1"]
    assert c.get_model_metadata("mlp")["inputs"][0]["shape"] == [-1, 4]
    assert c.get_model_metadata("mlp")["versions"] == ["2"]  # the latest version serves
    with pytest.raises(InferenceServerException, match="'nope' is not loaded"):
        c.get_model_metadata("nope")


@pytest.mark.parametrize("binary", [True, False])
def test_infer_efficientnet(server, binary):
    c = th.InferenceServerClient(server.url)
    x = np.load(os.path.join(MODEL_DIR, "chelsea.npy"))
    want = np.load(os.path.join(MODEL_DIR, "chelsea_expected_logits.npy"))
    y = infer_effnet(c, x, binary)
    np.testing.assert_allclose(y, want, rtol=1e-3, atol=1e-4)


def test_infer_versions_and_shapes(server):
    c = th.InferenceServerClient(server.url)
    for n in (1, 3, 7):
        x = np.random.default_rng(n).standard_normal((n, 4)).astype(np.float32)
        i = th.InferInput("x", [n, 4], "FP32")
        i.set_data_from_numpy(x)
        np.testing.assert_allclose(c.infer("mlp", [i]).as_numpy("y"), mlp_ref(x, 2), rtol=1e-5, atol=1e-5)
    with pytest.raises(InferenceServerException, match="version 1 is not loaded"):
        c.infer("mlp", [i], model_version="1")
    with pytest.raises(InferenceServerException, match="batch of 9 is over the model's max_batch_size 8"):
        big = th.InferInput("x", [9, 4], "FP32")
        big.set_data_from_numpy(np.zeros((9, 4), np.float32))
        c.infer("mlp", [big])


def test_model_config(server):
    c = th.InferenceServerClient(server.url)
    cfg = c.get_model_config("mlp")
    assert cfg["name"] == "mlp" and cfg["max_batch_size"] == 8
    assert cfg["input"] == [{"name": "x", "data_type": "TYPE_FP32", "dims": ["4"]}]  # without the batch dim
    assert cfg["dynamic_batching"]["max_queue_delay_microseconds"] == "1000"
    eff = c.get_model_config("effnet")
    assert "max_batch_size" not in eff and eff["input"][0]["dims"] == ["1", "3", "224", "224"]


def test_repository_load_unload(server):
    c = th.InferenceServerClient(server.url)
    index = {m["name"]: m for m in c.get_model_repository_index()}
    assert index["mlp"]["state"] == "READY" and index["mlp"]["version"] == "2"
    c.unload_model("mlp")
    assert not c.is_model_ready("mlp")
    status, reply = raw(server, "GET", "/v2/models/mlp/ready")  # not ready, and the answer says why
    assert status == 400 and "'mlp' is not loaded" in json.loads(reply)["error"], reply
    # A POST with no body and no Content-Length (`curl -X POST .../index`) is answered, not refused.
    host, port = server.url.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.putrequest("POST", "/v2/repository/index")
    conn.endheaders()
    r = conn.getresponse()
    index = json.loads(r.read())
    assert r.status == 200 and any(m["name"] == "mlp" and m.get("version") == "2" and m["state"] == "UNAVAILABLE"
                                   for m in index), index
    # A body the repository POSTs do not use, sent after the headers, is read and dropped: the next
    # request on the same kept-alive connection is answered as its own.
    conn.putrequest("POST", "/v2/repository/index")
    conn.putheader("Content-Length", "4000")
    conn.endheaders()
    time.sleep(0.1)
    conn.send(b"x" * 4000)
    r = conn.getresponse()
    assert r.status == 200, r.read()
    r.read()
    conn.request("GET", "/v2/health/ready")
    r = conn.getresponse()
    assert r.status == 200, r.read()
    r.read()
    conn.close()
    x = np.ones((2, 4), np.float32)
    i = th.InferInput("x", [2, 4], "FP32")
    i.set_data_from_numpy(x)
    with pytest.raises(InferenceServerException, match="not loaded"):
        c.infer("mlp", [i])
    c.load_model("mlp")
    np.testing.assert_allclose(c.infer("mlp", [i]).as_numpy("y"), mlp_ref(x, 2), rtol=1e-5, atol=1e-5)
    # A broken version 3: the load fails, and version 2 keeps serving.
    os.makedirs(os.path.join(server.repo, "mlp", "3"))
    with open(os.path.join(server.repo, "mlp", "3", "model.onnx"), "wb") as f:
        f.write(b"not a model")
    with pytest.raises(InferenceServerException, match="version 3"):
        c.load_model("mlp")
    np.testing.assert_allclose(c.infer("mlp", [i]).as_numpy("y"), mlp_ref(x, 2), rtol=1e-5, atol=1e-5)
    shutil.rmtree(os.path.join(server.repo, "mlp", "3"))


def test_malformed_requests(server):
    head = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
    cases = [
        (b"{not json", {}, "not a JSON object"),
        (json.dumps({"inputs": [{"name": "z", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}).encode(), {},
         "unknown input 'z'"),
        (json.dumps({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "INT64", "data": [1, 2, 3, 4]}]}).encode(), {},
         "the model takes FP32"),
        (json.dumps({"inputs": [{"name": "x", "shape": [1, 5], "datatype": "FP32", "data": [1, 2, 3, 4, 5]}]}).encode(), {},
         "input 'x'"),
        (json.dumps({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3]}]}).encode(), {},
         "data has 3"),
        (json.dumps({"inputs": []}).encode(), {}, "input 'x' of model 'mlp' is missing"),
        (json.dumps({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32",
                                 "parameters": {"binary_data_size": 1 << 40}}]}).encode(), None, "binary_data_size 1099511627776"),
        (json.dumps({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32",
                                 "parameters": {"binary_data_size": 16}}]}).encode() + b"\0" * 8, None, "binary_data_size 16"),
        (json.dumps(head).encode(), {"Inference-Header-Content-Length": "99999"}, "Inference-Header-Content-Length"),
        (json.dumps({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, "a"]}]}).encode(), {},
         "element 3 is not a number"),
    ]
    for body, headers, expect in cases:
        if headers is None:  # binary: the JSON header's length, then the (wrong) binary part
            header_len = body.index(b"}]}") + 3
            headers = {"Inference-Header-Content-Length": str(header_len)}
        status, reply = raw(server, "POST", "/v2/models/mlp/infer", body, headers)
        assert 400 <= status < 500, (expect, status, reply)
        assert expect in json.loads(reply)["error"], (expect, reply)
    status, _ = raw(server, "POST", "/v2/models/nope/infer", json.dumps(head).encode())
    assert status == 404
    status, reply = raw(server, "GET", "/v2/no/such/route")
    assert status == 404 and "no route" in json.loads(reply)["error"]
    status, reply = raw(server, "POST", "/v2/models/mlp/infer", json.dumps(head).encode())
    assert status == 200 and json.loads(reply)["outputs"][0]["shape"] == [1, 3]


def metrics(server):
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=30) as r:
        text = r.read().decode()
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            values[key] = float(value)
    return text, values


def test_metrics(server):
    before = metrics(server)[1]
    c = th.InferenceServerClient(server.url)
    x = np.ones((3, 4), np.float32)
    i = th.InferInput("x", [3, 4], "FP32")
    i.set_data_from_numpy(x)
    for _ in range(5):
        c.infer("mlp", [i])
    raw(server, "POST", "/v2/models/mlp/infer", b"{not json")
    text, after = metrics(server)
    assert "# TYPE nv_inference_request_success counter" in text
    key = '{model="mlp",version="2"}'
    delta = {k: after["nv_" + k + key] - before.get("nv_" + k + key, 0) for k in (
        "inference_request_success", "inference_request_failure", "inference_count", "inference_exec_count",
        "inference_compute_infer_duration_us", "inference_request_duration_us")}
    assert delta["inference_request_success"] == 5 and delta["inference_request_failure"] == 1
    assert delta["inference_count"] == 15  # batch rows: 5 requests of 3 (max_batch_size 8)
    assert delta["inference_exec_count"] == 5
    assert 0 < delta["inference_compute_infer_duration_us"] <= delta["inference_request_duration_us"]
    assert after['nv_inference_request_success{model="effnet",version="1"}'] >= 2


def test_concurrent_requests_all_answered(server):
    x = np.load(os.path.join(MODEL_DIR, "chelsea.npy"))
    want = np.load(os.path.join(MODEL_DIR, "chelsea_expected_logits.npy"))
    results, errors = [], []

    def work(k):
        try:
            c = th.InferenceServerClient(server.url)
            y = infer_effnet(c, x, binary=k % 2 == 0)
            results.append(float(np.abs(y - want).max()))
        except Exception as e:  # noqa: BLE001 - counted
            errors.append(repr(e))
    threads = [threading.Thread(target=work, args=(k,)) for k in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(results) == 64 and max(results) < 1e-3


def test_a_burst_of_connections_is_accepted(server):
    """The HTTP and metrics ports listen with a deep backlog (cpp-httplib's own is 5: under load the
    accept queue overflowed, and connections the kernel completed with SYN cookies were reset at
    their first request); and 300 clients that connect at once, more than --http-thread-count, and
    each send a request are all answered."""
    host, port = server.url.split(":")
    for p in (port, str(server.metrics_port)):
        listening = subprocess.run(["ss", "-Hltn", f"sport = :{p}"], capture_output=True, text=True, check=True).stdout
        backlog = [int(line.split()[2]) for line in listening.splitlines() if line.startswith("LISTEN")]
        assert backlog and min(backlog) >= 128, f"port {p}: {listening!r}"
    barrier = threading.Barrier(300)
    answers, errors = [], []

    def work():
        try:
            barrier.wait(timeout=60)
            with socket.create_connection((host, int(port)), timeout=60) as s:
                s.sendall(f"GET /v2/health/ready HTTP/1.1\r\nHost: {server.url}\r\nConnection: close\r\n\r\n".encode())
                reply = b""
                while chunk := s.recv(4096):
                    reply += chunk
                answers.append(reply.split(b"\r\n", 1)[0])
        except Exception as e:  # noqa: BLE001 - counted
            errors.append(repr(e))
    threads = [threading.Thread(target=work) for _ in range(300)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, f"{len(errors)} of 300 failed, first: {errors[0]}"
    assert answers == [b"HTTP/1.1 200 OK"] * 300


def test_reload_keeps_unchanged_versions(server):
    """A load of unchanged files keeps the loaded version (its counters go on); a changed setting
    loads it again (a new version object, counters from zero)."""
    c = th.InferenceServerClient(server.url)
    i = th.InferInput("x", [1, 4], "FP32")
    i.set_data_from_numpy(np.ones((1, 4), np.float32))
    key = 'nv_inference_request_success{model="mlp",version="2"}'
    c.infer("mlp", [i])
    before = metrics(server)[1][key]
    assert before >= 1
    c.load_model("mlp")
    assert metrics(server)[1][key] == before  # kept: same object, same counters
    cfg = os.path.join(server.repo, "mlp", "config.pbtxt")
    text = open(cfg).read()
    with open(cfg, "w") as f:
        f.write(text.replace("max_queue_delay_microseconds: 1000", "max_queue_delay_microseconds: 2000"))
    try:
        c.load_model("mlp")
        assert metrics(server)[1][key] == 0  # loaded again
        assert c.get_model_config("mlp")["dynamic_batching"]["max_queue_delay_microseconds"] == "2000"
    finally:
        with open(cfg, "w") as f:
            f.write(text)
        c.load_model("mlp")
    np.testing.assert_allclose(c.infer("mlp", [i]).as_numpy("y"), mlp_ref(np.ones((1, 4), np.float32), 2),
                               rtol=1e-5, atol=1e-5)


def test_sigterm_drains_in_flight_requests(server):
    x = np.load(os.path.join(MODEL_DIR, "chelsea.npy"))
    done, errors = [], []

    def work():
        try:
            infer_effnet(th.InferenceServerClient(server.url, connection_timeout=120, network_timeout=120), x, True)
            done.append(1)
        except Exception as e:  # noqa: BLE001 - counted
            errors.append(repr(e))
    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    time.sleep(0.5)  # requests in flight: 8 forwards on 2 sessions take longer than this
    code = server.stop()
    for t in threads:
        t.join()
    assert code == 0, server.proc.stdout.read()
    assert len(done) + len(errors) == 8
    assert len(done) >= 1, errors  # those the server had accepted were answered
    out = server.proc.stdout.read()
    assert "stopping" in out and "stopped" in out
