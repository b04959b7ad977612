#!/usr/bin/env python3
"""An OTLP profiles receiver for the end-to-end tests.

It shares no code with the daemon's exporter: it serves
opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export with the stubs
PyPI's opentelemetry-proto generated from the official .proto files, on grpcio (Python).

Each request is checked as a receiver must read it (every table of the dictionary starts with
its zero value, every index is in range, every sample has one value per the profile's single
sample type) and appended to <record-dir>/requests.jsonl: the headers, and per resource its
attributes, its profiles (each with its sample type, period, and its stacks resolved through
the dictionary to "function|frame type" names, innermost first, with their values) and the
files its frames are in, with their build-ids. What the
checks found wrong goes in the record's "errors" list.

Prints "listening on <port>" once it accepts connections.
"""

import argparse
import json
import os
import threading
import time
from concurrent import futures

import grpc
from opentelemetry.proto.collector.profiles.v1development import (
    profiles_service_pb2,
    profiles_service_pb2_grpc,
)


def any_value(value):
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


class Request:
    """One request read through its dictionary; `errors` lists what a receiver would refuse."""

    def __init__(self, request):
        self.dictionary = request.dictionary
        self.errors = []
        d = self.dictionary
        for table, zero in (
            ("mapping_table", None),
            ("location_table", None),
            ("function_table", None),
            ("link_table", None),
            ("attribute_table", None),
            ("stack_table", None),
        ):
            entries = getattr(d, table)
            if not entries or entries[0].ByteSize() != 0:
                self.errors.append(f"{table}[0] is not the zero value")
        if not d.string_table or d.string_table[0] != "":
            self.errors.append('string_table[0] is not ""')
        # The files (and build-ids) the frames of the resource being read are in.
        self.mappings = set()
        self.resources = [self.resource(r) for r in request.resource_profiles]

    def entry(self, table, index):
        entries = getattr(self.dictionary, table)
        if not 0 <= index < len(entries):
            self.errors.append(f"{table} index {index} out of range ({len(entries)})")
            return None
        return entries[index]

    def string(self, index):
        value = self.entry("string_table", index)
        return "" if value is None else value

    def frame(self, location_index):
        location = self.entry("location_table", location_index)
        if location is None:
            return "?"
        names = []
        for line in location.lines:
            function = self.entry("function_table", line.function_index)
            names.append("?" if function is None else self.string(function.name_strindex))
        if location.mapping_index != 0:
            mapping = self.entry("mapping_table", location.mapping_index)
            if mapping is not None:
                build_id = ""
                for index in mapping.attribute_indices:
                    attribute = self.entry("attribute_table", index)
                    if attribute is not None and self.string(attribute.key_strindex) == "process.executable.build_id.gnu":
                        build_id = any_value(attribute.value)
                self.mappings.add((self.string(mapping.filename_strindex), build_id))
        frame_type = ""
        for index in location.attribute_indices:
            attribute = self.entry("attribute_table", index)
            if attribute is not None and self.string(attribute.key_strindex) == "profile.frame.type":
                frame_type = any_value(attribute.value)
        # An inlined chain reads innermost first: "inner;outer|jvm".
        return ";".join(names) + "|" + frame_type

    def profile(self, profile):
        stacks = []
        for sample in profile.samples:
            if len(sample.values) != 1:
                self.errors.append(f"a sample has {len(sample.values)} values for one sample type")
            stack = self.entry("stack_table", sample.stack_index)
            frames = [] if stack is None else [self.frame(i) for i in stack.location_indices]
            stacks.append({"frames": frames, "value": sum(sample.values)})
        return {
            "sample_type": [
                self.string(profile.sample_type.type_strindex),
                self.string(profile.sample_type.unit_strindex),
            ],
            "period_type": [
                self.string(profile.period_type.type_strindex),
                self.string(profile.period_type.unit_strindex),
            ],
            "period": profile.period,
            "time_unix_nano": profile.time_unix_nano,
            "duration_nano": profile.duration_nano,
            "stacks": stacks,
        }

    def resource(self, resource_profiles):
        attributes = {
            kv.key: any_value(kv.value) for kv in resource_profiles.resource.attributes
        }
        profiles = []
        scopes = []
        self.mappings = set()
        for scope_profiles in resource_profiles.scope_profiles:
            scopes.append([scope_profiles.scope.name, scope_profiles.scope.version])
            profiles.extend(self.profile(p) for p in scope_profiles.profiles)
        return {
            "attributes": attributes,
            "scopes": scopes,
            "profiles": profiles,
            "mappings": sorted(self.mappings),
        }


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--record-dir", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument(
        "--fail-with",
        help="answer every export with this gRPC status code name (e.g. UNAVAILABLE)",
    )
    args = parser.parse_args()
    os.makedirs(args.record_dir, exist_ok=True)
    lock = threading.Lock()

    class Service(profiles_service_pb2_grpc.ProfilesServiceServicer):
        def Export(self, request, context):
            if args.fail_with:
                context.abort(getattr(grpc.StatusCode, args.fail_with), "refused by the test receiver")
            read = Request(request)
            metadata = context.invocation_metadata()
            line = {
                "received_at": time.time(),
                "bytes": request.ByteSize(),
                "headers": {k: v for k, v in metadata if k in ("authorization", "x-scope-orgid")},
                "errors": read.errors,
                "resources": read.resources,
            }
            with lock, open(os.path.join(args.record_dir, "requests.jsonl"), "a") as out:
                out.write(json.dumps(line) + "\n")
            return profiles_service_pb2.ExportProfilesServiceResponse()

    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=4),
        options=[("grpc.max_receive_message_length", 64 << 20), ("grpc.so_reuseport", 0)],
    )
    profiles_service_pb2_grpc.add_ProfilesServiceServicer_to_server(Service(), server)
    port = server.add_insecure_port(f"127.0.0.1:{args.port}")
    server.start()
    print(f"listening on {port}", flush=True)
    server.wait_for_termination()


if __name__ == "__main__":
    main()
