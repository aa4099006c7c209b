"""Starting and stopping `kiln serve` for the serve tests: free ports for HTTP, gRPC and metrics, the
server's output in a log file (so a chatty server never blocks on a full pipe), readiness polled over
gRPC (the server, or one model), and the log's tail in the error when it does not come up."""
import os
import signal
import socket
import subprocess
import time

import tritonclient.grpc as tg


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(kiln, repo, device="cpu", ready_model=None, timeout=120):
    """kiln serve on `repo`; returns the process with .http, .grpc (host:port), .url (= .grpc),
    .metrics_port and .repo set, once the server (or `ready_model`) is ready."""
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    log = open(os.path.join(repo, "serve.log"), "w+")
    proc = subprocess.Popen([kiln, "serve", "--model-repository", repo, "--http-port", str(http_port), "--grpc-port",
                             str(grpc_port), "--metrics-port", str(metrics_port), "--host", "127.0.0.1", "--device", device],
                            stdout=log, stderr=subprocess.STDOUT, text=True)
    proc.log = log
    proc.http, proc.grpc = f"127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}"
    proc.url, proc.metrics_port, proc.repo = proc.grpc, metrics_port, repo
    deadline = time.time() + timeout
    while True:
        try:
            c = tg.InferenceServerClient(proc.grpc)
            if c.is_model_ready(ready_model) if ready_model else c.is_server_ready():
                return proc
        except Exception:  # noqa: BLE001 - not up yet
            pass
        if proc.poll() is not None or time.time() > deadline:
            stop(proc)
            log.seek(0)
            raise RuntimeError("kiln serve did not become ready: " + log.read()[-3000:])
        time.sleep(0.2)


def stop(proc):
    """SIGTERM (the server drains what is in flight), then the log's tail."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    proc.log.seek(0)
    return proc.log.read()[-3000:]
