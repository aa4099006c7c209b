"""kiln serve over gRPC, its config.pbtxt and its dynamic batcher, driven by tritonclient.grpc (`make serve`).

A repository of: an MLP with three versions served by a `latest { num_versions: 2 }` policy, batched
(max_batch_size 8, a 200 ms queue delay, preferred batch 4, one instance) so concurrent requests merge;
a slow batched model on the reference kernels (one instance, a queue of one) for timeouts and a full
queue; and EfficientNet-Lite0 with a config asking to batch a fixed batch dim, which must fail to load
with a reason. Every RPC kiln serves; raw and typed tensor contents; concurrent requests of 1-3 rows
each answered with their own rows; timeouts, a full queue, malformed requests; load, unload and a failed
load leaving the serving versions in place.
"""
import contextlib
import json
import os
import shutil
import subprocess
import threading
import time
import urllib.request

import numpy as np
import onnx
import pytest
import tritonclient.grpc as tg
from onnx import TensorProto, helper, numpy_helper
from tritonclient.utils import InferenceServerException

import server_util
from test_http import KILN, MODEL_DIR, mlp_ref, write_mlp

MLP_CONFIG = """
name: "mlp"
max_batch_size: 8
version_policy { latest { num_versions: 2 } }
dynamic_batching {
  max_queue_delay_microseconds: 200000
  preferred_batch_size: [ 4, 8 ]
}
instance_group [ { count: 1 kind: KIND_CPU } ]
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""

SLOW_CONFIG = """
max_batch_size: 4
dynamic_batching { default_queue_policy { max_queue_size: 1 allow_timeout_override: true } }
instance_group [ { count: 1 } ]
parameters { key: "device" value { string_value: "cpu-ref" } }
"""


GATHER_CONFIG = """
max_batch_size: 8
dynamic_batching { max_queue_delay_microseconds: 300000 preferred_batch_size: [ 4 ] }
instance_group [ { count: 1 } ]
"""
# A long queue delay and two preferred sizes: two requests form a preferred batch and run at once.
PREFERRED_CONFIG = """
max_batch_size: 8
dynamic_batching { max_queue_delay_microseconds: 60000000 preferred_batch_size: [ 2, 8 ] }
instance_group [ { count: 1 } ]
"""
# Two sessions behind one queue: a request alone in the queue runs on its handler thread, others on
# the sessions' workers.
TWO_CONFIG = """
max_batch_size: 8
dynamic_batching { max_queue_delay_microseconds: 2000 }
instance_group [ { count: 2 } ]
"""
# A 2 s queue delay and request timeouts honoured: a lone request waits for company until its timeout.
PATIENT_CONFIG = """
max_batch_size: 8
dynamic_batching { max_queue_delay_microseconds: 2000000 default_queue_policy { allow_timeout_override: true } }
instance_group [ { count: 1 } ]
"""
TABLE = np.arange(40, dtype=np.float32).reshape(10, 4)


def write_gather(path):
    """ids[N, 2] (int64) -> rows of a 10 x 4 table: an id out of range is that request's error."""
    g = helper.make_graph([helper.make_node("Gather", ["table", "ids"], ["y"])], "gather",
                          [helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", 2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2, 4])],
                          [numpy_helper.from_array(TABLE, "table")])
    os.makedirs(os.path.dirname(path), exist_ok=True)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)


def write_slow(path):
    """x[N, 256, 256] through 24 MatMul + Tanh layers: ~100 ms per row on the reference kernels."""
    rng = np.random.default_rng(5)
    nodes, inits, prev = [], [], "x"
    for k in range(24):
        inits.append(numpy_helper.from_array((rng.standard_normal((256, 256)) / 16).astype(np.float32), f"w{k}"))
        nodes += [helper.make_node("MatMul", [prev, f"w{k}"], [f"m{k}"]), helper.make_node("Tanh", [f"m{k}"], [f"t{k}"])]
        prev = f"t{k}"
    nodes.append(helper.make_node("Identity", [prev], ["y"]))
    g = helper.make_graph(nodes, "slow", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 256, 256])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 256, 256])], inits)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = str(tmp_path_factory.mktemp("grepo"))
    for v in (1, 2, 3):
        write_mlp(os.path.join(repo, "mlp", str(v), "model.onnx"), v)
    with open(os.path.join(repo, "mlp", "config.pbtxt"), "w") as f:
        f.write(MLP_CONFIG)
    write_slow(os.path.join(repo, "slow", "1", "model.onnx"))
    with open(os.path.join(repo, "slow", "config.pbtxt"), "w") as f:
        f.write(SLOW_CONFIG)
    write_gather(os.path.join(repo, "gather", "1", "model.onnx"))
    with open(os.path.join(repo, "gather", "config.pbtxt"), "w") as f:
        f.write(GATHER_CONFIG)
    write_mlp(os.path.join(repo, "two", "1", "model.onnx"), 1)
    with open(os.path.join(repo, "two", "config.pbtxt"), "w") as f:
        f.write(TWO_CONFIG)
    write_gather(os.path.join(repo, "patient", "1", "model.onnx"))
    with open(os.path.join(repo, "patient", "config.pbtxt"), "w") as f:
        f.write(PATIENT_CONFIG)
    write_gather(os.path.join(repo, "preferred", "1", "model.onnx"))
    with open(os.path.join(repo, "preferred", "config.pbtxt"), "w") as f:
        f.write(PREFERRED_CONFIG)
    os.makedirs(os.path.join(repo, "effnet", "1"))
    shutil.copy(os.path.join(MODEL_DIR, "model.onnx"), os.path.join(repo, "effnet", "1", "model.onnx"))
    with open(os.path.join(repo, "effnet", "config.pbtxt"), "w") as f:
        f.write("max_batch_size: 8\n")
    proc = server_util.start(KILN, repo)
    yield proc
    server_util.stop(proc)


def mlp_input(x, typed=False):
    i = tg.InferInput("x", list(x.shape), "FP32")
    i.set_data_from_numpy(x)
    if typed:  # the same data as InferTensorContents.fp32_contents instead of raw bytes
        i._raw_content = None
        i._input.contents.fp32_contents[:] = x.ravel().tolist()
    return i


def test_health_metadata_config(server):
    c = tg.InferenceServerClient(server.url)
    assert c.is_server_live() and c.is_server_ready()
    meta = c.get_server_metadata(as_json=True)
    assert meta["name"] == "kiln" and "model_configuration" in meta["extensions"]
    m = c.get_model_metadata("mlp", as_json=True)
    assert m["versions"] == ["2", "3"]  # latest { num_versions: 2 } of 1, 2, 3
    assert m["inputs"] == [{"name": "x", "datatype": "FP32", "shape": ["-1", "4"]}]
    assert c.is_model_ready("mlp", "2") and c.is_model_ready("mlp", "3") and not c.is_model_ready("mlp", "1")
    cfg = c.get_model_config("mlp", as_json=True)["config"]
    assert cfg["max_batch_size"] == 8 and cfg["dynamic_batching"]["preferred_batch_size"] == [4, 8]
    assert cfg["input"][0]["dims"] == ["4"] and cfg["instance_group"][0]["count"] == 1
    assert cfg["version_policy"] == {"latest": {"num_versions": 2}}
    with pytest.raises(InferenceServerException, match="'nope' is not loaded"):
        c.get_model_metadata("nope")


def test_bad_config_is_not_loaded_with_its_reason(server):
    c = tg.InferenceServerClient(server.url)
    index = {m["name"]: m for m in c.get_model_repository_index(as_json=True)["models"]}
    assert index["effnet"]["state"] == "UNAVAILABLE"
    assert "max_batch_size 8 needs dim 0 of input 'input' open" in index["effnet"]["reason"]
    assert index["slow"]["state"] == "READY"
    assert not c.is_model_ready("effnet")


@pytest.mark.parametrize("typed", [False, True])
def test_infer_versions(server, typed):
    c = tg.InferenceServerClient(server.url)
    x = np.random.default_rng(3).standard_normal((3, 4)).astype(np.float32)
    for version, want in (("", 3), ("2", 2), ("3", 3)):
        r = c.infer("mlp", [mlp_input(x, typed)], model_version=version)
        assert r.get_response().model_version == str(want)
        np.testing.assert_allclose(r.as_numpy("y"), mlp_ref(x, want), rtol=1e-5, atol=1e-5)
    with pytest.raises(InferenceServerException, match="version 1 is not loaded"):
        c.infer("mlp", [mlp_input(x)], model_version="1")


def counters(server, model, version):
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=30) as r:
        text = r.read().decode()
    key = '{model="%s",version="%d"}' % (model, version)
    return {line.split("{")[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if key in line}


def test_concurrent_requests_are_batched_and_split_back(server):
    c = tg.InferenceServerClient(server.url)
    rows = [1, 2, 3, 1, 2, 1, 1, 3, 2, 1, 1, 2]
    xs = [np.random.default_rng(100 + k).standard_normal((n, 4)).astype(np.float32) for k, n in enumerate(rows)]
    results, errors = {}, []

    def work(k):
        try:
            results[k] = tg.InferenceServerClient(server.url).infer("mlp", [mlp_input(xs[k])]).as_numpy("y")
        except Exception as e:  # noqa: BLE001 - counted
            errors.append(repr(e))
    before = counters(server, "mlp", 3)
    threads = [threading.Thread(target=work, args=(k,)) for k in range(len(rows))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(results) == len(rows)
    for k, x in enumerate(xs):  # every request gets its own rows back
        np.testing.assert_allclose(results[k], mlp_ref(x, 3), rtol=1e-5, atol=1e-5)
    after = counters(server, "mlp", 3)
    assert after["nv_inference_count"] - before["nv_inference_count"] == sum(rows)
    assert after["nv_inference_request_success"] - before["nv_inference_request_success"] == len(rows)
    # A 200 ms queue delay and a preferred batch of 4: twelve requests arriving together share runs.
    assert after["nv_inference_exec_count"] - before["nv_inference_exec_count"] <= len(rows) // 2
    with pytest.raises(InferenceServerException, match="batch of 9 is over the model's max_batch_size 8"):
        c.infer("mlp", [mlp_input(np.zeros((9, 4), np.float32))])


def test_a_preferred_batch_size_runs_without_waiting_out_the_delay(server):
    """As in Triton: once the queued rows form a preferred size (2 of [2, 8]), the batch runs, rather
    than waiting the 60 s queue delay for the larger one."""
    results = {}

    def work(k):
        i = tg.InferInput("ids", [1, 2], "INT64")
        i.set_data_from_numpy(np.array([[k, k + 1]], np.int64))
        results[k] = tg.InferenceServerClient(server.url).infer("preferred", [i]).as_numpy("y")
    before = counters(server, "preferred", 1)
    threads = [threading.Thread(target=work, args=(k,), daemon=True) for k in range(2)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(results) == [0, 1], f"answered after {time.monotonic() - start:.1f} s: {sorted(results)}"
    for k in range(2):
        np.testing.assert_array_equal(results[k], TABLE[[[k, k + 1]]])
    after = counters(server, "preferred", 1)
    assert after["nv_inference_exec_count"] - before.get("nv_inference_exec_count", 0) == 1
    assert after["nv_inference_count"] - before.get("nv_inference_count", 0) == 2


def test_two_sessions_under_bursts_answer_every_request_with_its_own_rows(server):
    """24 clients, each sending 20 requests of 1-3 rows back to back, to a model with two sessions:
    requests run alone on their handler thread when the queue is empty and in batches on the
    sessions' workers when it is not; every answer must be the request's own rows."""
    errors, answered = [], [0] * 24

    def work(k):
        rng = np.random.default_rng(k)
        c = tg.InferenceServerClient(server.url)
        try:
            for _ in range(20):
                x = rng.standard_normal((int(rng.integers(1, 4)), 4)).astype(np.float32)
                np.testing.assert_allclose(c.infer("two", [mlp_input(x)]).as_numpy("y"), mlp_ref(x, 1), rtol=1e-5, atol=1e-5)
                answered[k] += 1
        except Exception as e:  # noqa: BLE001 - counted
            errors.append(repr(e))
    before = counters(server, "two", 1)
    threads = [threading.Thread(target=work, args=(k,), daemon=True) for k in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and sum(answered) == 24 * 20, (errors[:3], sum(answered))
    after = counters(server, "two", 1)
    assert after["nv_inference_request_success"] - before.get("nv_inference_request_success", 0) == 24 * 20


@pytest.mark.parametrize("mode", [["--protocol", "grpc"], ["--protocol", "grpc", "--async", "--client-threads", "2"],
                                  ["--protocol", "http"]], ids=["grpc", "grpc-async", "http"])
def test_load_tool_counts_every_request_the_server_answered(server, mode):
    """kiln-serve-load (bench/serve_load.py's client for GPU rates) against two sessions: no failure,
    and as many requests answered as the server counted, each of one row."""
    tool = os.path.join(os.path.dirname(os.path.abspath(KILN)), "kiln-serve-load")
    url = server.http if "http" in mode else server.grpc
    before = counters(server, "two", 1)
    out = subprocess.run([tool, "--url", url, "--model", "two", "--concurrency", "6", "--seconds", "1.5"] + mode,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout.strip().splitlines()[-1])
    after = counters(server, "two", 1)
    assert r["failures"] == 0 and r["requests"] > 20, r
    assert r["async"] == ("--async" in mode)
    assert after["nv_inference_request_success"] - before["nv_inference_request_success"] == r["requests"]
    assert after["nv_inference_count"] - before["nv_inference_count"] == r["requests"]
    assert 0 < r["p50_ms"] <= r["p99_ms"]


def test_a_bad_request_does_not_fail_its_batch(server):
    """Four requests merged into one batch, one with an id out of range: it alone gets the error."""
    ids = [np.array([[1, 2]]), np.array([[3, 99]]), np.array([[4, 5]]), np.array([[6, 7]])]
    results, errors = {}, {}

    def work(k):
        i = tg.InferInput("ids", [1, 2], "INT64")
        i.set_data_from_numpy(ids[k].astype(np.int64))
        try:
            results[k] = tg.InferenceServerClient(server.url).infer("gather", [i]).as_numpy("y")
        except InferenceServerException as e:
            errors[k] = str(e)
    before = counters(server, "gather", 1)
    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert list(errors) == [1] and "out of range" in errors[1], errors
    for k in (0, 2, 3):
        np.testing.assert_array_equal(results[k], TABLE[ids[k]])
    after = counters(server, "gather", 1)
    assert after["nv_inference_request_failure"] - before.get("nv_inference_request_failure", 0) == 1
    # They did share a run (a 300 ms queue delay, a preferred batch of 4): one execution of 4 rows.
    assert after["nv_inference_exec_count"] - before.get("nv_inference_exec_count", 0) == 1
    # A timeout too large for the clock ("forever") is no timeout, not an instant one.
    i = tg.InferInput("ids", [1, 2], "INT64")
    i.set_data_from_numpy(np.array([[0, 1]], np.int64))
    np.testing.assert_array_equal(tg.InferenceServerClient(server.url).infer("gather", [i], timeout=2**63 - 1)
                                  .as_numpy("y"), TABLE[[[0, 1]]])


def test_a_lone_request_times_out_while_it_waits_for_a_batch(server):
    """Alone in the queue, the request's own handler thread forms the batch; when its 50 ms timeout
    passes during the 2 s queue delay it is answered "timed out" then, and never runs."""
    i = tg.InferInput("ids", [1, 2], "INT64")
    i.set_data_from_numpy(np.array([[0, 1]], np.int64))
    before = counters(server, "patient", 1)
    start = time.monotonic()
    with pytest.raises(InferenceServerException, match="timed out"):
        tg.InferenceServerClient(server.url).infer("patient", [i], timeout=50000)
    elapsed = time.monotonic() - start
    assert 0.04 <= elapsed < 1.0, elapsed
    after = counters(server, "patient", 1)
    assert after.get("nv_inference_exec_count", 0) == before.get("nv_inference_exec_count", 0)
    # The model serves the next request as usual (it waits out the delay alone, then runs).
    np.testing.assert_array_equal(tg.InferenceServerClient(server.url).infer("patient", [i]).as_numpy("y"), TABLE[[[0, 1]]])


def slow_input(rows):
    x = np.full((rows, 256, 256), 0.01, np.float32)
    i = tg.InferInput("x", list(x.shape), "FP32")
    i.set_data_from_numpy(x)
    return i


def test_timeout_and_full_queue(server):
    c = tg.InferenceServerClient(server.url)
    done = []

    def long_request():
        tg.InferenceServerClient(server.url).infer("slow", [slow_input(4)])
        done.append(1)
    # A runs (4 rows, several hundred ms on the reference kernels); B waits in the queue of one.
    a = threading.Thread(target=long_request)
    a.start()
    time.sleep(0.1)
    with pytest.raises(InferenceServerException, match="timed out after .* us in the queue"):
        c.infer("slow", [slow_input(1)], timeout=20000)  # its own timeout: 20 ms
    b = threading.Thread(target=long_request)
    b.start()
    time.sleep(0.1)
    with pytest.raises(InferenceServerException, match="queue is full"):
        c.infer("slow", [slow_input(1)])
    # Refused with a timeout of its own: no deadline of it may stay behind for the timer to find.
    with pytest.raises(InferenceServerException, match="queue is full"):
        c.infer("slow", [slow_input(1)], timeout=200000)
    a.join()
    b.join()
    time.sleep(0.3)  # past the refused request's deadline
    assert len(done) == 2  # neither the timeout nor the rejections disturbed the others
    y = c.infer("slow", [slow_input(1)]).as_numpy("y")
    assert y.shape == (1, 256, 256) and np.isfinite(y).all()


def test_malformed_requests(server):
    c = tg.InferenceServerClient(server.url)
    x = np.ones((2, 4), np.float32)
    cases = []
    i = tg.InferInput("z", [2, 4], "FP32")
    i.set_data_from_numpy(x)
    cases.append((i, "unknown input 'z'"))
    i = tg.InferInput("x", [2, 4], "INT64")
    i.set_data_from_numpy(x.astype(np.int64))
    cases.append((i, "the model takes FP32"))
    i = tg.InferInput("x", [2, 4], "FP32")
    i.set_data_from_numpy(x)
    i._input.shape[:] = [3, 4]  # the raw bytes hold 8 floats, the shape says 12
    cases.append((i, "need 48"))
    i = tg.InferInput("x", [2, 4], "FP32")
    i.set_data_from_numpy(x)
    i._raw_content = None
    i._input.contents.fp32_contents[:] = [1.0, 2.0, 3.0]
    cases.append((i, "fp32_contents has 3"))
    for inp, expect in cases:
        with pytest.raises(InferenceServerException, match=expect):
            c.infer("mlp", [inp])
    with pytest.raises(InferenceServerException, match="'nope' is not loaded"):
        c.infer("nope", [mlp_input(x)])
    with pytest.raises(InferenceServerException, match="unknown output 'q'"):
        c.infer("mlp", [mlp_input(x)], outputs=[tg.InferRequestedOutput("q")])
    np.testing.assert_allclose(c.infer("mlp", [mlp_input(x)]).as_numpy("y"), mlp_ref(x, 3), rtol=1e-5, atol=1e-5)


def test_load_unload_and_failed_load(server):
    c = tg.InferenceServerClient(server.url)
    x = np.ones((1, 4), np.float32)
    c.unload_model("mlp")
    assert not c.is_model_ready("mlp")
    with pytest.raises(InferenceServerException, match="not loaded"):
        c.infer("mlp", [mlp_input(x)])
    c.load_model("mlp")
    assert c.is_model_ready("mlp", "2") and c.is_model_ready("mlp", "3")
    cfg = os.path.join(server.repo, "mlp", "config.pbtxt")

    @contextlib.contextmanager
    def config(text):
        """mlp's config.pbtxt is `text` inside the block, MLP_CONFIG again after it."""
        with open(cfg, "w") as f:
            f.write(text)
        try:
            yield
        finally:
            with open(cfg, "w") as f:
                f.write(MLP_CONFIG)
    # A config that does not parse: the load fails naming the file and line; versions 2 and 3 keep serving.
    with config(MLP_CONFIG.replace("max_batch_size: 8", "max_batch_size: eight")):
        with pytest.raises(InferenceServerException, match=r"config.pbtxt: line 3"):
            c.load_model("mlp")
    np.testing.assert_allclose(c.infer("mlp", [mlp_input(x)], model_version="2").as_numpy("y"), mlp_ref(x, 2),
                               rtol=1e-5, atol=1e-5)
    # Dims that disagree with the model: named, and nothing changes.
    with config(MLP_CONFIG.replace("dims: [ 4 ]", "dims: [ 5 ]")):
        with pytest.raises(InferenceServerException, match=r"input 'x'.*5.*4"):
            c.load_model("mlp")
    assert c.is_model_ready("mlp", "3")
    # version_policy specific: only version 1.
    try:
        with config(MLP_CONFIG.replace("latest { num_versions: 2 }", "specific { versions: [1] }")):
            c.load_model("mlp")
            assert c.is_model_ready("mlp", "1") and not c.is_model_ready("mlp", "3")
            np.testing.assert_allclose(c.infer("mlp", [mlp_input(x)]).as_numpy("y"), mlp_ref(x, 1), rtol=1e-5, atol=1e-5)
    finally:
        c.load_model("mlp")
