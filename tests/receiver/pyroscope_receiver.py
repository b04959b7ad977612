#!/usr/bin/env python3
"""A stand-in for Grafana Pyroscope's ingester, for the end-to-end tests.

It shares no code with the daemon's exporter: its gRPC stubs are generated here, with
grpcio-tools, from the .proto files, and it is served by grpcio (Python). Each Push request is
appended to <record-dir>/requests.jsonl (labels, headers, the raw profiles' file names), and each
raw profile is written as received to <record-dir>/profile-<n>.bin.

Prints "listening on <port>" once it accepts connections.
"""

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from concurrent import futures

import grpc
from grpc_tools import protoc


def generate_stubs(proto_root, out_dir):
    """Compiles the push and types protos to Python modules in out_dir."""
    for proto in ("types/v1/types.proto", "push/v1/push.proto"):
        status = protoc.main(
            [
                "grpc_tools.protoc",
                f"-I{proto_root}",
                f"--python_out={out_dir}",
                f"--grpc_python_out={out_dir}",
                os.path.join(proto_root, proto),
            ]
        )
        if status != 0:
            sys.exit(f"protoc failed on {proto}")
    # The proto package `types` would import as Python's standard `types` module: move it aside.
    os.rename(os.path.join(out_dir, "types"), os.path.join(out_dir, "pb_types"))
    push_pb2 = os.path.join(out_dir, "push", "v1", "push_pb2.py")
    with open(push_pb2) as source:
        code = source.read().replace("from types.v1 import", "from pb_types.v1 import")
    with open(push_pb2, "w") as out:
        out.write(code)
    sys.path.insert(0, out_dir)


class Recorder:
    """Appends what each request carried, in arrival order."""

    def __init__(self, record_dir):
        self.record_dir = record_dir
        self.lock = threading.Lock()
        os.makedirs(record_dir, exist_ok=True)
        existing = [n for n in os.listdir(record_dir) if n.startswith("profile-")]
        self.next_profile = len(existing)

    def record(self, request, metadata):
        with self.lock:
            series = []
            for one in request.series:
                files = []
                for sample in one.samples:
                    name = f"profile-{self.next_profile:06d}.bin"
                    self.next_profile += 1
                    with open(os.path.join(self.record_dir, name), "wb") as out:
                        out.write(sample.raw_profile)
                    files.append(name)
                series.append(
                    {
                        "labels": {pair.name: pair.value for pair in one.labels},
                        "profiles": files,
                    }
                )
            line = {
                "received_at": time.time(),
                "headers": {k: v for k, v in metadata if k in ("authorization", "x-scope-orgid")},
                "series": series,
            }
            with open(os.path.join(self.record_dir, "requests.jsonl"), "a") as out:
                out.write(json.dumps(line) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--proto-root", required=True)
    parser.add_argument("--record-dir", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument(
        "--fail-with",
        help="answer every push with this gRPC status code name (e.g. UNAUTHENTICATED)",
    )
    parser.add_argument("--tls-cert", help="serve TLS with this certificate chain (PEM)")
    parser.add_argument("--tls-key", help="and this private key (PEM)")
    args = parser.parse_args()

    generate_stubs(args.proto_root, tempfile.mkdtemp(prefix="receiver-stubs-"))
    from push.v1 import push_pb2, push_pb2_grpc  # noqa: E402 (generated above)

    recorder = Recorder(args.record_dir)

    class Pusher(push_pb2_grpc.PusherServiceServicer):
        def Push(self, request, context):
            if args.fail_with:
                context.abort(getattr(grpc.StatusCode, args.fail_with), "refused by the test receiver")
            recorder.record(request, context.invocation_metadata())
            return push_pb2.PushResponse()

    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=4),
        options=[("grpc.max_receive_message_length", 64 << 20), ("grpc.so_reuseport", 0)],
    )
    push_pb2_grpc.add_PusherServiceServicer_to_server(Pusher(), server)
    address = f"127.0.0.1:{args.port}"
    if args.tls_cert:
        with open(args.tls_key, "rb") as key, open(args.tls_cert, "rb") as cert:
            credentials = grpc.ssl_server_credentials([(key.read(), cert.read())])
        port = server.add_secure_port(address, credentials)
    else:
        port = server.add_insecure_port(address)
    if port == 0:
        sys.exit(f"cannot listen on port {args.port}")
    server.start()
    print(f"listening on {port}", flush=True)
    server.wait_for_termination()


if __name__ == "__main__":
    main()
