"""kiln optimize and kiln repo (`make serve`): candidates validated against the fp32 reference and the
fastest within the budget registered as a version with its report; a version that fails validation is
recorded and never promoted; promote and rollback switch what a running kiln serve answers with, under
load, losing no request; a promotion the server cannot load leaves everything as it was.
"""
import json
import os
import subprocess
import threading
import time

import numpy as np
import pytest
import tritonclient.http as th

from test_http import KILN, Server, mlp_ref, write_mlp


def kiln(*args):
    return subprocess.run([KILN, *args], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("opt")
    val = root / "val"
    rng = np.random.default_rng(0)
    for k in range(5):
        (val / f"s{k}").mkdir(parents=True)
        np.save(val / f"s{k}" / "x.npy", rng.standard_normal((3, 4)).astype(np.float32))
    for weights in (2, 3):
        write_mlp(str(root / f"mlp{weights}.onnx"), weights)
    r = root / "repo"
    return {"root": root, "val": str(val), "repo": str(r)}


def optimize(repo, weights, *extra):
    return kiln("optimize", str(repo["root"] / f"mlp{weights}.onnx"), "--repo", repo["repo"], "--name", "mlp",
                "--validation", repo["val"], "--device", "cpu", "--iterations", "5", *extra)


def test_register_validate_and_refuse_failed(repo):
    r = optimize(repo, 2)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "version 1 of 'mlp' registered: fp32" in r.stdout
    report = json.load(open(os.path.join(repo["repo"], "mlp", "1", "report.json")))
    assert report["status"] == "validated" and report["chosen"] == "fp32"
    c = report["candidates"][0]
    assert 0 < c["error_percent"] < 0.5 and c["median_ms"] > 0 and c["outputs"][0]["rel_l2"] < 1e-5
    assert len(report["source_sha256"]) == 64 and report["validation"]["samples"] == 5
    assert c["build_config"]["device"] == "cpu"
    # A budget nothing meets: recorded as failed, nothing servable written, exit 1, never promoted.
    r = optimize(repo, 2, "--accuracy-budget", "0")
    assert r.returncode == 1 and "version 2 of 'mlp' recorded as FAILED" in r.stdout, r.stdout + r.stderr
    v2 = os.path.join(repo["repo"], "mlp", "2")
    assert json.load(open(os.path.join(v2, "report.json")))["status"] == "failed"
    assert not os.path.exists(os.path.join(v2, "model.kiln")) and os.path.exists(os.path.join(v2, "candidate.kiln"))
    r = kiln("repo", "promote", repo["repo"], "mlp", "2")
    assert r.returncode != 0 and "failed validation" in r.stderr
    r = optimize(repo, 3)
    assert r.returncode == 0 and "version 3 of 'mlp' registered" in r.stdout, r.stdout + r.stderr
    r = kiln("repo", "list", repo["repo"])
    assert "version 1: validated: fp32" in r.stdout and "version 2: failed" in r.stdout, r.stdout
    r = kiln("repo", "promote", repo["repo"], "mlp", "1")
    assert r.returncode == 0, r.stderr
    assert "specific { versions: [ 1 ] }" in open(os.path.join(repo["repo"], "mlp", "config.pbtxt")).read()
    assert "* version 1" in kiln("repo", "list", repo["repo"]).stdout


def test_promote_and_rollback_under_load_lose_nothing(repo):
    server = Server(repo["repo"])
    try:
        c = th.InferenceServerClient(server.url)
        assert c.get_model_metadata("mlp")["versions"] == ["1"]
        x = np.random.default_rng(9).standard_normal((2, 4)).astype(np.float32)
        want = {"1": mlp_ref(x, 2), "3": mlp_ref(x, 3)}  # version 1 was built from weights 2, version 3 from 3
        seen, bad, errors, stop = set(), [], [], threading.Event()

        def load():
            cl = th.InferenceServerClient(server.url)
            i = th.InferInput("x", [2, 4], "FP32")
            i.set_data_from_numpy(x)
            while not stop.is_set():
                try:
                    r = cl.infer("mlp", [i])
                    v = r.get_response()["model_version"]
                    seen.add(v)
                    if not np.allclose(r.as_numpy("y"), want[v], rtol=1e-5, atol=1e-5):
                        bad.append(v)
                except Exception as e:  # noqa: BLE001 - counted
                    errors.append(repr(e))
        threads = [threading.Thread(target=load) for _ in range(4)]
        for t in threads:
            t.start()
        time.sleep(0.3)
        r = kiln("repo", "promote", repo["repo"], "mlp", "3", "--server", server.url)
        assert r.returncode == 0, r.stderr
        assert c.get_model_metadata("mlp")["versions"] == ["3"]
        time.sleep(0.3)
        r = kiln("repo", "rollback", repo["repo"], "mlp", "--server", server.url)
        assert r.returncode == 0 and "rolled back" in r.stdout, r.stderr
        time.sleep(0.3)
        stop.set()
        for t in threads:
            t.join()
        assert not errors and not bad, (errors[:3], bad[:3])
        assert seen == {"1", "3"}
        assert c.get_model_metadata("mlp")["versions"] == ["1"]
        # A version the server cannot load: the command fails with the server's reason, nothing changes.
        broken = os.path.join(repo["repo"], "mlp", "4")
        os.makedirs(broken)
        with open(os.path.join(broken, "model.kiln"), "wb") as f:
            f.write(b"not an engine")
        cfg = open(os.path.join(repo["repo"], "mlp", "config.pbtxt")).read()
        r = kiln("repo", "promote", repo["repo"], "mlp", "4", "--server", server.url)
        assert r.returncode != 0 and "could not load model 'mlp' version 4" in r.stderr, r.stderr
        assert open(os.path.join(repo["repo"], "mlp", "config.pbtxt")).read() == cfg
        assert c.get_model_metadata("mlp")["versions"] == ["1"]
        assert np.allclose(c.infer("mlp", [_input(x)]).as_numpy("y"), want["1"], rtol=1e-5, atol=1e-5)
    finally:
        server.stop()


def _input(x):
    i = th.InferInput("x", list(x.shape), "FP32")
    i.set_data_from_numpy(x)
    return i


def test_quantized_candidates_need_calibration_and_are_validated(repo, tmp_path):
    """With --calib (samples apart from the validation set) the int8 and fp8 candidates are built as
    `kiln build --int8|--fp8 --calib` builds them, judged on the validation samples like the others, and
    reported; without --calib, naming them is an error."""
    rng = np.random.default_rng(1)
    cal = tmp_path / "cal"
    for k in range(8):
        (cal / f"c{k}").mkdir(parents=True)
        np.save(cal / f"c{k}" / "x.npy", rng.standard_normal((3, 4)).astype(np.float32))
    qrepo = str(tmp_path / "qrepo")
    model = str(repo["root"] / "mlp2.onnx")
    r = kiln("optimize", model, "--repo", qrepo, "--name", "q", "--validation", repo["val"], "--device", "cpu",
             "--candidates", "int8")
    assert r.returncode != 0 and "candidate int8 needs --calib DIR" in r.stderr, r.stdout + r.stderr
    assert not os.path.exists(os.path.join(qrepo, "q", "1"))
    r = kiln("optimize", model, "--repo", qrepo, "--name", "q", "--validation", repo["val"], "--device", "cpu",
             "--iterations", "5", "--calib", str(cal), "--accuracy-budget", "20")
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.load(open(os.path.join(qrepo, "q", "1", "report.json")))
    by = {c["precision"]: c for c in report["candidates"]}
    assert list(by) == ["fp32", "int8", "fp8"], list(by)
    # 8-bit products are further from fp32 than fp32 is, yet close: each validated and timed.
    for name in ("int8", "fp8"):
        c = by[name]
        assert by["fp32"]["error_percent"] < c["error_percent"] < 20, (name, c)
        assert c["median_ms"] > 0 and c["meets_budget"], c
        assert c["quantization"]["method"] == "minmax" and c["quantization"]["calib"].endswith("cal"), c
    assert report["chosen"] in by
