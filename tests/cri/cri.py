#!/usr/bin/env python3
"""A small CRI client for the engine tests: drives a container runtime's CRI gRPC API as the
kubelet does, without a kubelet.

  cri.py gen OUTDIR API_PROTO        compile the CRI api.proto (runtime.v1) into OUTDIR
  cri.py call SOCKET METHOD JSON     call RuntimeService/METHOD (or ImageService/METHOD) with the
                                     request given as protobuf JSON; print the response as JSON
  cri.py exec SOCKET ID TIMEOUT CMD...   ExecSync: print the process's stdout (stderr to
                                     stderr) and exit with its exit code

Requests are protobuf JSON with the proto's own field names, so every field the api.proto has
is available, e.g. CDI devices as the kubelet passes a device plugin's: CreateContainer with
`"config": {..., "CDI_devices": [{"name": "nvidia.com/gpu=0"}]}` (tests/engines/cri_cdi.sh).

`call` and `exec` import the stubs from the directory in $CRI_GEN (made by `gen`). Errors: one
line on stderr naming the method and the gRPC status, exit 1.
"""

import os
import re
import sys


def gen(outdir, proto):
    """Compiles api.proto with grpc_tools. The gogoproto options only steer Go code generation:
    they are dropped so that protoc needs no gogo.proto."""
    from grpc_tools import protoc
    import grpc_tools

    src = open(proto, encoding="utf-8").read()
    src = re.sub(r'^import "github.com/gogo/protobuf/gogoproto/gogo.proto";\n', "", src, flags=re.M)
    src = re.sub(r"^option \(gogoproto\.[a-z_]+\)\s*=\s*[a-z]+;\n", "", src, flags=re.M)
    src = re.sub(r"\s*\[\(gogoproto\.[^\]]*\]", "", src)
    if "gogoproto" in src:
        sys.exit(f"cri.py: {proto}: gogoproto options left after stripping; update cri.py")
    os.makedirs(outdir, exist_ok=True)
    with open(os.path.join(outdir, "api.proto"), "w", encoding="utf-8") as f:
        f.write(src)
    include = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    rc = protoc.main(["protoc", f"-I{outdir}", f"-I{include}", f"--python_out={outdir}",
                      f"--grpc_python_out={outdir}", os.path.join(outdir, "api.proto")])
    if rc != 0:
        sys.exit(f"cri.py: protoc failed on {proto} ({rc})")


def stubs(socket):
    import grpc

    sys.path.insert(0, os.environ["CRI_GEN"])
    import api_pb2
    import api_pb2_grpc

    channel = grpc.insecure_channel(f"unix://{socket}")
    return (api_pb2, api_pb2_grpc.RuntimeServiceStub(channel),
            api_pb2_grpc.ImageServiceStub(channel))


def call(socket, method, body):
    import grpc
    from google.protobuf import json_format

    pb, runtime, images = stubs(socket)
    stub = runtime if hasattr(runtime, method) else images
    if not hasattr(stub, method):
        sys.exit(f"cri.py: no CRI method {method}")
    req = json_format.Parse(body, getattr(pb, f"{method}Request")())
    try:
        resp = getattr(stub, method)(req, timeout=120)
    except grpc.RpcError as e:
        sys.exit(f"cri.py: {method}: {e.code().name}: {e.details()}")
    print(json_format.MessageToJson(resp, preserving_proto_field_name=True, indent=None))


def exec_sync(socket, cid, timeout, cmd):
    import grpc

    pb, runtime, _ = stubs(socket)
    req = pb.ExecSyncRequest(container_id=cid, cmd=cmd, timeout=int(timeout))
    try:
        resp = runtime.ExecSync(req, timeout=int(timeout) + 30)
    except grpc.RpcError as e:
        sys.exit(f"cri.py: ExecSync: {e.code().name}: {e.details()}")
    sys.stdout.buffer.write(resp.stdout)
    sys.stderr.buffer.write(resp.stderr)
    sys.exit(resp.exit_code)


def main(argv):
    if len(argv) == 3 and argv[0] == "gen":
        gen(argv[1], argv[2])
    elif len(argv) == 4 and argv[0] == "call":
        call(argv[1], argv[2], argv[3])
    elif len(argv) >= 5 and argv[0] == "exec":
        exec_sync(argv[1], argv[2], argv[3], argv[4:])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
