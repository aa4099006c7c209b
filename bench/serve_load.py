#!/usr/bin/env python3
"""Load test of `kiln serve`: throughput and p50/p99 latency at several concurrencies, over HTTP
(binary tensors) and gRPC, beside the engine's own latency measured by `kiln bench` in the same run.

    python3 bench/serve_load.py --kiln build/kiln [--model models/efficientnet-lite0/model.onnx]
        [--device cpu] [--precision fp32] [--max-batch-size 8 --delay-us 2000 --input-dims 3x224x224]
        [--instances 2] [--protocols http,grpc] [--concurrency 1,4,16,64] [--seconds 10] [--out r.json]
        [--client python|cpp] [--engine-batches 1,64 --engine-shapes input:{b}x3x224x224] [--soak-minutes M]

--model may be an engine file (model.kiln, e.g. built with `kiln build --shapes input:1..64x3x224x224`),
served as it is; `kiln bench` then times it at --engine-shapes with {b} replaced by each engine batch.
--client cpp drives the server with kiln-serve-load (C++ threads, built beside kiln), for GPU rates;
with it, --shared-memory none,system,cuda repeats each protocol's levels with the inputs in a registered
shared memory region (and, with --output-shared-memory-size, the outputs) instead of in the requests,
and --protocols takes grpc-async: gRPC requests driven through completion queues by a few client threads
(perf_analyzer's --async) instead of a blocked thread each. --soak-minutes M then keeps the load on
for M minutes at changing concurrencies and fails when the server's host or GPU memory grows (issue 30).

A temporary repository holds the model (built at load); with --max-batch-size > 0 its config.pbtxt
turns on the dynamic batcher (the model's dim 0 must be a batch; --input-dims gives the other dims of
each input, comma-separated per input, so a GPU build gets the batch range). Each concurrency level
runs C client threads, each with its own connection, sending one sample (batch 1) at a time for
--seconds; every request is checked to succeed and every latency is kept. The clients are Python
(tritonclient) on the same machine: at thousands of requests per second they, not the server, are the
limit, which the report's client CPU column shows.
"""
import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import onnx

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
LATENCY = re.compile(r"latency \([^)]*\): median ([0-9.]+) ms, p90 ([0-9.]+) ms, p99 ([0-9.]+) ms")
NP_TYPES = {"FP32": np.float32, "FP16": np.float16, "INT64": np.int64, "INT32": np.int32}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(values, q):
    v = sorted(values)
    return v[min(len(v) - 1, max(0, int(np.ceil(q / 100 * len(v))) - 1))]


def engine_latency(args, batch):
    if args.model.endswith(".kiln"):
        cmd = [args.kiln, "bench", args.model, "--shapes", args.engine_shapes.format(b=batch), "--iterations", "200",
               "--warmup", "20"]
    else:
        cmd = [args.kiln, "bench", args.model, "--device", args.device, "--batch", str(batch), "--iterations",
               "200", "--warmup", "20"]
        if args.precision != "fp32":
            cmd.append("--" + args.precision)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    m = LATENCY.search(out.stdout)
    if not m:
        raise RuntimeError(f"kiln bench gave no latency: {out.stdout[-500:]} {out.stderr[-500:]}")
    return {"batch": batch, "median_ms": float(m[1]), "p99_ms": float(m[3]),
            "throughput": batch / float(m[1]) * 1000.0}


def write_repo(args, root):
    d = os.path.join(root, "m", "1")
    os.makedirs(d)
    os.symlink(os.path.abspath(args.model), os.path.join(d, "model.kiln" if args.model.endswith(".kiln") else "model.onnx"))
    cfg = [f'parameters {{ key: "precision" value {{ string_value: "{args.precision}" }} }}',
           f"instance_group [ {{ count: {args.instances} }} ]"]
    if args.max_batch_size > 0:
        cfg.append(f"max_batch_size: {args.max_batch_size}")
        preferred = "".join(f" preferred_batch_size: {b}" for b in args.preferred.split(",") if b)
        cfg.append(f"dynamic_batching {{ max_queue_delay_microseconds: {args.delay_us}{preferred} }}")
        names = args.input_names.split(",") if args.input_names else \
            [i.name for i in onnx.load(args.model, load_external_data=False).graph.input]
        for name, dims in zip(names, (args.input_dims or "").split(",") if args.input_dims else []):
            cfg.append(f'input [ {{ name: "{name}" dims: [ {", ".join(dims.split("x"))} ] }} ]')
    if args.model.endswith(".kiln"):
        cfg = cfg[1:]  # an engine keeps the precision it was built with
    with open(os.path.join(root, "m", "config.pbtxt"), "w") as f:
        f.write("\n".join(cfg) + "\n")


def client_for(protocol, url):
    if protocol == "http":
        import tritonclient.http as t
        return t, t.InferenceServerClient(url, connection_timeout=300, network_timeout=300)
    import tritonclient.grpc as t
    return t, t.InferenceServerClient(url)


def server_counters(port):
    """The server's Triton counters for model m (summed over versions)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("nv_") and 'model="m"' in line:
            name = line.split("{")[0]
            out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def per_request(a, b):
    """Where a level's requests spent their time inside the server: per request, in ms, and the
    rows per execution (the batches the batcher formed)."""
    d = {k: b.get(k, 0.0) - a.get(k, 0.0) for k in b}
    n = d.get("nv_inference_request_success", 0.0) + d.get("nv_inference_request_failure", 0.0)
    execs = d.get("nv_inference_exec_count", 0.0)
    if not n:
        return {}
    return {"request_ms": d.get("nv_inference_request_duration_us", 0.0) / n / 1000,
            "queue_ms": d.get("nv_inference_queue_duration_us", 0.0) / n / 1000,
            "compute_ms": d.get("nv_inference_compute_infer_duration_us", 0.0) / n / 1000,
            "rows_per_execution": d.get("nv_inference_count", 0.0) / execs if execs else 0.0}


def server_memory(pid, metrics_port):
    """The server's resident memory (MiB) and, from its own gauge, the first GPU's memory in use by
    every process on it (MiB; nan without a GPU)."""
    rss = float("nan")
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) / 1024
    gpu = float("nan")
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=30) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("nv_gpu_memory_used_bytes") and gpu != gpu:  # the first GPU's
                gpu = float(line.rsplit(" ", 1)[1]) / 2**20
    return rss, gpu


def soak(args, run, pid, metrics_port):
    """--soak-minutes of load in 20 s rounds at concurrencies that make different batches (1, 7, 33,
    the largest level), the last protocol and shared-memory mode of the levels, the server's memory
    sampled after each round. Memory differs with the concurrency (request buffers, threads' malloc
    arenas), so growth is judged between rounds at the same concurrency, in the second half (allocators,
    caches and the dynamic engine's per-shape plans settle in the first): for each concurrency the
    largest sample minus its first, and the least-squares slope of the largest concurrency's samples.
    More than 8 MiB of host or GPU memory fails (bench/soak.py's bound), as does any failed request."""
    top = max(int(x) for x in args.concurrency.split(","))
    cycle = [1, 7, 33, top]
    samples, requests, failures = [], 0, 0
    t0 = time.time()
    while time.time() - t0 < args.soak_minutes * 60 or len(samples) < 2 * len(cycle):
        c = cycle[len(samples) % len(cycle)]
        r = run(c, 20.0)
        requests += r["requests"]
        failures += r.get("failures", len(r["errors"]))
        rss, gpu = server_memory(pid, metrics_port)
        samples.append({"minutes": (time.time() - t0) / 60, "concurrency": c, "rss_mib": rss, "gpu_mib": gpu,
                        "requests": requests})
        print(json.dumps({"soak": samples[-1]}), flush=True)
    half = [x for x in samples if x["minutes"] >= samples[-1]["minutes"] / 2]
    out = {"minutes": samples[-1]["minutes"], "requests": requests, "failures": failures, "samples": samples}
    ok = failures == 0
    for key in ("rss_mib", "gpu_mib"):
        if any(x[key] != x[key] for x in half):  # nan: not measured
            continue
        growth = 0.0
        for c in cycle:
            v = [x[key] for x in half if x["concurrency"] == c]
            if v:
                growth = max(growth, max(v) - v[0])
        t = [x["minutes"] for x in half if x["concurrency"] == top]
        v = [x[key] for x in half if x["concurrency"] == top]
        slope = 0.0
        if len(v) > 2:
            mt, mv = sum(t) / len(t), sum(v) / len(v)
            den = sum((a - mt) ** 2 for a in t)
            slope = sum((a - mt) * (b - mv) for a, b in zip(t, v)) / den if den else 0.0
        out[key] = {"first": samples[0][key], "last": samples[-1][key], "slope_per_min": slope,
                    "second_half_growth": growth}
        ok &= growth <= 8
    out["ok"] = ok
    print(json.dumps({"soak_result": {k: v for k, v in out.items() if k != "samples"}}), flush=True)
    return out


def level_cpp(args, protocol, url, concurrency, seconds, shm="none"):
    """The same level driven by kiln-serve-load (C++ threads), tensors in shared memory or not."""
    tool = os.path.join(os.path.dirname(os.path.abspath(args.kiln)), "kiln-serve-load")
    extra = ["--shared-memory", shm] if shm != "none" else []
    if shm != "none" and args.output_shared_memory_size:
        extra += ["--output-shared-memory-size", str(args.output_shared_memory_size)]
    if protocol == "grpc-async":  # gRPC driven by completion queues (perf_analyzer's --async)
        protocol, extra = "grpc", extra + ["--async"]
    out = subprocess.run([tool, "--url", url, "--protocol", protocol, "--model", "m", "--concurrency", str(concurrency),
                          "--seconds", str(seconds)] + extra, capture_output=True, text=True, timeout=seconds + 300)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(f"kiln-serve-load failed: {out.stderr[-500:]}")
    r = json.loads(lines[-1])
    r["errors"] = [r["first_error"]] if r.get("failures") else []
    r["client"] = "cpp"
    r["protocol"] = "grpc-async" if r.get("async") else r["protocol"]
    return r


def level(protocol, url, meta, concurrency, seconds):
    """C threads sending batch-1 requests for `seconds`: throughput and latency percentiles."""
    latencies, errors = [], []
    stop = time.time() + seconds
    inputs = meta["inputs"]

    def work(k):
        t, c = client_for(protocol, url)
        rng = np.random.default_rng(k)
        reqs = []
        for i in inputs:
            shape = [1 if d == -1 or d == "-1" else int(d) for d in i["shape"]]
            x = rng.standard_normal(shape).astype(NP_TYPES[i["datatype"]])
            r = t.InferInput(i["name"], shape, i["datatype"])
            if protocol == "http":
                r.set_data_from_numpy(x, binary_data=True)
            else:
                r.set_data_from_numpy(x)
            reqs.append(r)
        outs = [t.InferRequestedOutput(o["name"], binary_data=True) if protocol == "http"
                else t.InferRequestedOutput(o["name"]) for o in meta["outputs"]]
        mine = []
        while time.time() < stop:
            t0 = time.perf_counter()
            try:
                c.infer("m", reqs, outputs=outs)
            except Exception as e:  # noqa: BLE001 - counted and reported
                errors.append(repr(e))
                break
            mine.append((time.perf_counter() - t0) * 1000.0)
        latencies.extend(mine)
    cpu0 = os.times()
    t0 = time.time()
    threads = [threading.Thread(target=work, args=(k,)) for k in range(concurrency)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.time() - t0
    cpu1 = os.times()
    client_cpu = (cpu1.user - cpu0.user + cpu1.system - cpu0.system) / wall
    return {"protocol": protocol, "concurrency": concurrency, "requests": len(latencies), "errors": errors[:3],
            "throughput": len(latencies) / wall, "p50_ms": percentile(latencies, 50) if latencies else None,
            "p99_ms": percentile(latencies, 99) if latencies else None, "client_cpu_cores": round(client_cpu, 2)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kiln", default=os.path.join(REPO, "build", "kiln"))
    ap.add_argument("--model", default=os.path.join(REPO, "models", "efficientnet-lite0", "model.onnx"))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--max-batch-size", type=int, default=0)
    ap.add_argument("--delay-us", type=int, default=1000)
    ap.add_argument("--preferred", default="", help="the batcher's preferred_batch_size list, comma-separated")
    ap.add_argument("--input-dims", default="")
    ap.add_argument("--instances", type=int, default=1)
    ap.add_argument("--protocols", default="http,grpc", help="http, grpc, and with --client cpp grpc-async")
    ap.add_argument("--concurrency", default="1,4,16,64")
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--engine-batches", default="1", help="batches `kiln bench` times the engine at")
    ap.add_argument("--engine-shapes", default="input:{b}x3x224x224", help="for a .kiln model: `kiln bench --shapes`")
    ap.add_argument("--input-names", default="", help="for a .kiln model with --input-dims: the inputs, in order")
    ap.add_argument("--client", default="python", choices=["python", "cpp"])
    ap.add_argument("--shared-memory", default="none", help="with --client cpp: none, system, cuda (comma-separated)")
    ap.add_argument("--output-shared-memory-size", type=int, default=0, help="bytes per output region per client thread")
    ap.add_argument("--soak-minutes", type=float, default=0,
                    help="after the levels: load for this long, the server's memory sampled (issue 30)")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    if "grpc-async" in args.protocols.split(",") and args.client != "cpp":
        ap.error("--protocols grpc-async needs --client cpp")

    result = {"model": args.model, "device": args.device,
              "precision": "as built (engine file)" if args.model.endswith(".kiln") else args.precision,
              "max_batch_size": args.max_batch_size, "delay_us": args.delay_us, "instances": args.instances,
              "preferred": args.preferred,
              "client": args.client,
              "engine": [engine_latency(args, int(b)) for b in args.engine_batches.split(",")], "levels": []}
    with tempfile.TemporaryDirectory() as root:
        write_repo(args, root)
        http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
        server = subprocess.Popen([args.kiln, "serve", "--model-repository", root, "--http-port", str(http_port),
                                   "--grpc-port", str(grpc_port), "--metrics-port", str(metrics_port), "--host", "127.0.0.1",
                                   "--device", args.device], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            deadline = time.time() + 1800
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v2/models/m/ready", timeout=5) as r:
                        if r.status == 200:
                            break
                except urllib.error.HTTPError:  # the server is up (it loads before it listens): why not ready?
                    req = urllib.request.Request(f"http://127.0.0.1:{http_port}/v2/repository/index", data=b"{}")
                    with urllib.request.urlopen(req, timeout=5) as r:
                        raise RuntimeError(f"kiln serve did not load the model: {r.read().decode()}")
                except OSError:  # noqa: BLE001 - not up yet
                    pass
                if server.poll() is not None or time.time() > deadline:
                    raise RuntimeError("kiln serve did not load the model: " + (server.stdout.read() if server.poll() is not None else ""))
                time.sleep(0.5)
            with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v2/models/m", timeout=30) as r:
                meta = json.loads(r.read())
            urls = {"http": f"127.0.0.1:{http_port}", "grpc": f"127.0.0.1:{grpc_port}", "grpc-async": f"127.0.0.1:{grpc_port}"}
            modes = args.shared_memory.split(",") if args.client == "cpp" else ["none"]
            for protocol, shm in ((p, m) for p in args.protocols.split(",") for m in modes):
                if args.client == "cpp":
                    run = lambda c, secs: level_cpp(args, protocol, urls[protocol], c, secs, shm)  # noqa: E731
                else:
                    run = lambda c, secs: level(protocol, urls[protocol], meta, c, secs)  # noqa: E731
                run(max(int(x) for x in args.concurrency.split(",")), 2.0)  # warm-up: sessions, connections, graphs
                for c in (int(x) for x in args.concurrency.split(",")):
                    before = server_counters(metrics_port)
                    r = run(c, args.seconds)
                    r["server"] = per_request(before, server_counters(metrics_port))
                    result["levels"].append(r)
                    print(json.dumps(r), flush=True)
            if args.soak_minutes > 0:
                result["soak"] = soak(args, run, server.pid, metrics_port)
            # Triton's GPU gauges (NVML) as the server reports them after the load.
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=30) as r:
                result["gpu_metrics"] = [line for line in r.read().decode().splitlines() if line.startswith("nv_gpu_")]
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=120)
    print(json.dumps(result["engine"]))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    soak_ok = result.get("soak", {}).get("ok", True)
    return 0 if soak_ok and all(not r["errors"] for r in result["levels"]) else 1


if __name__ == "__main__":
    sys.exit(main())
