#!/usr/bin/env python3
"""Checks the daemon's OTLP .proto files against the official generated code.

The daemon's files (profiler-daemon/proto/opentelemetry) are written from opentelemetry-proto's
field numbers; PyPI's opentelemetry-proto is generated from the official files. Every message
and service of ours must exist there under the same full name, with the same fields (name,
number, type, label, message type) and methods, and no field of theirs may be missing from ours.

Prints one line per file compared and exits 1 on the first difference list that is not empty.
"""

import argparse
import importlib
import os
import sys
import tempfile

from google.protobuf import descriptor_pb2
from grpc_tools import protoc

# Our files, and the official modules generated from the same files.
FILES = {
    "opentelemetry/proto/common/v1/common.proto": "opentelemetry.proto.common.v1.common_pb2",
    "opentelemetry/proto/resource/v1/resource.proto": "opentelemetry.proto.resource.v1.resource_pb2",
    "opentelemetry/proto/profiles/v1development/profiles.proto": "opentelemetry.proto.profiles.v1development.profiles_pb2",
    "opentelemetry/proto/collector/profiles/v1development/profiles_service.proto": "opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2",
}


def field_shape(field):
    return (field.number, field.type, field.label, field.type_name.lstrip("."), field.oneof_index if field.HasField("oneof_index") else None)


def messages(file_proto):
    """Every message of a FileDescriptorProto, nested ones included, by full name."""
    found = {}

    def walk(prefix, message):
        name = f"{prefix}.{message.name}"
        found[name] = message
        for nested in message.nested_type:
            walk(name, nested)

    for message in file_proto.message_type:
        walk(file_proto.package, message)
    return found


def compare(ours, theirs):
    differences = []
    our_messages, their_messages = messages(ours), messages(theirs)
    for name, message in our_messages.items():
        other = their_messages.get(name)
        if other is None:
            differences.append(f"message {name} is not in the official file")
            continue
        our_fields = {f.name: field_shape(f) for f in message.field}
        their_fields = {f.name: field_shape(f) for f in other.field}
        for field, shape in their_fields.items():
            if field not in our_fields:
                differences.append(f"{name}.{field} is missing from ours")
            elif our_fields[field] != shape:
                differences.append(f"{name}.{field}: ours {our_fields[field]}, official {shape}")
        for field in our_fields:
            if field not in their_fields:
                differences.append(f"{name}.{field} is not in the official message")
    for name in their_messages:
        if name not in our_messages:
            differences.append(f"message {name} is missing from ours")
    their_services = {s.name: s for s in theirs.service}
    for service in ours.service:
        other = their_services.get(service.name)
        if other is None:
            differences.append(f"service {service.name} is not in the official file")
            continue
        their_methods = {m.name: (m.input_type, m.output_type) for m in other.method}
        for method in service.method:
            if their_methods.get(method.name) != (method.input_type, method.output_type):
                differences.append(f"{service.name}.{method.name} differs")
    return differences


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--proto-root", required=True)
    args = parser.parse_args()
    out = os.path.join(tempfile.mkdtemp(prefix="otlp-proto-check-"), "ours.pb")
    status = protoc.main(
        ["grpc_tools.protoc", f"-I{args.proto_root}", "--include_imports", f"--descriptor_set_out={out}"]
        + [os.path.join(args.proto_root, f) for f in FILES]
    )
    if status != 0:
        sys.exit("protoc failed on our OTLP files")
    ours = descriptor_pb2.FileDescriptorSet()
    with open(out, "rb") as f:
        ours.ParseFromString(f.read())
    by_name = {f.name: f for f in ours.file}
    failed = False
    for path, module in FILES.items():
        theirs = descriptor_pb2.FileDescriptorProto()
        importlib.import_module(module).DESCRIPTOR.CopyToProto(theirs)
        differences = compare(by_name[path], theirs)
        print(f"{path}: {len(messages(by_name[path]))} messages, {len(differences)} differences")
        for difference in differences:
            print(f"  {difference}")
        failed = failed or bool(differences)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
