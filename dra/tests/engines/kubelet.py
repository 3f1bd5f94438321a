#!/usr/bin/env python3
"""What a kubelet and an API server do to gpushare-dra, for the engine test (dra_cri.sh), from
the plugin's own .proto files:

  kubelet.py gen OUTDIR PROTODIR          compile dra/proto/*.proto into OUTDIR ($KUBELET_GEN)
  kubelet.py register SOCKET              GetInfo, print it as JSON, NotifyRegistrationStatus(true)
  kubelet.py prepare ENDPOINT VER NS/NAME/UID...    NodePrepareResources (VER v1 or v1beta1),
                                          print the response as JSON
  kubelet.py unprepare ENDPOINT NS/NAME/UID...      NodeUnprepareResources, print the response
  kubelet.py apiserver PORTFILE DIR       a fake API server on 127.0.0.1 (port written to
                                          PORTFILE): ResourceClaims from DIR/claims/NS/NAME.json;
                                          ResourceSlices listed, applied (DIR/slices/NAME.json)
                                          and deleted as the plugin asks

Errors: one line on stderr, exit 1.
"""

import glob
import json
import os
import sys


def gen(outdir, protodir):
    from grpc_tools import protoc

    os.makedirs(outdir, exist_ok=True)
    files = sorted(glob.glob(os.path.join(protodir, "*.proto")))
    rc = protoc.main(["protoc", f"-I{protodir}", f"--python_out={outdir}",
                      f"--grpc_python_out={outdir}"] + files)
    if rc != 0:
        sys.exit(f"kubelet.py: protoc failed ({rc})")


def channel(socket):
    import grpc

    # The :authority is Python's default for a unix socket, the socket's path, as the kubelet's
    # registration client sends it: not a valid HTTP authority, which the plugin must take.
    return grpc.insecure_channel(f"unix://{socket}")


def as_json(msg):
    from google.protobuf import json_format

    return json_format.MessageToJson(msg, preserving_proto_field_name=True, indent=None)


def register(socket):
    import pluginregistration_pb2 as pb
    import pluginregistration_pb2_grpc as rpc

    stub = rpc.RegistrationStub(channel(socket))
    info = stub.GetInfo(pb.InfoRequest(), timeout=30)
    print(as_json(info))
    stub.NotifyRegistrationStatus(pb.RegistrationStatus(plugin_registered=True), timeout=30)


def claims(pb, args):
    out = []
    for a in args:
        ns, name, uid = a.split("/")
        out.append(pb.Claim(namespace=ns, name=name, uid=uid))
    return out


def prepare(endpoint, version, args):
    import importlib

    ch = channel(endpoint)
    pb = importlib.import_module(f"dra_{version}_pb2")
    rpc = importlib.import_module(f"dra_{version}_pb2_grpc")
    resp = rpc.DRAPluginStub(ch).NodePrepareResources(
        pb.NodePrepareResourcesRequest(claims=claims(pb, args)), timeout=60)
    print(as_json(resp))


def unprepare(endpoint, args):
    ch = channel(endpoint)
    import dra_v1_pb2 as pb
    import dra_v1_pb2_grpc as rpc

    resp = rpc.DRAPluginStub(ch).NodeUnprepareResources(
        pb.NodeUnprepareResourcesRequest(claims=claims(pb, args)), timeout=60)
    print(as_json(resp))


def apiserver(portfile, root):
    import re
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from urllib.parse import urlparse

    lock = threading.Lock()
    slices = os.path.join(root, "slices")
    os.makedirs(slices, exist_ok=True)
    claim_re = re.compile(r"^/apis/resource\.k8s\.io/v1/namespaces/([^/]+)/resourceclaims/([^/]+)$")
    slice_re = re.compile(r"^/apis/resource\.k8s\.io/v1/resourceslices/([^/]+)$")

    class Handler(BaseHTTPRequestHandler):
        def send(self, code, body):
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def not_found(self, what):
            self.send(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                            "message": f"{what} not found", "reason": "NotFound", "code": 404})

        def log_message(self, fmt, *args):
            sys.stderr.write("apiserver: " + fmt % args + "\n")

        def do_GET(self):
            path = urlparse(self.path).path
            m = claim_re.match(path)
            if m:
                p = os.path.join(root, "claims", m.group(1), m.group(2) + ".json")
                if not os.path.exists(p):
                    return self.not_found(f'resourceclaims.resource.k8s.io "{m.group(2)}"')
                with open(p, encoding="utf-8") as f:
                    return self.send(200, json.load(f))
            if path == "/apis/resource.k8s.io/v1/resourceslices":
                with lock:
                    items = []
                    for p in sorted(glob.glob(os.path.join(slices, "*.json"))):
                        with open(p, encoding="utf-8") as f:
                            items.append(json.load(f))
                return self.send(200, {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSliceList",
                                       "metadata": {"resourceVersion": "1"}, "items": items})
            self.not_found(path)

        def do_PATCH(self):
            m = slice_re.match(urlparse(self.path).path)
            if not m:
                return self.not_found(self.path)
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            body.setdefault("metadata", {})["name"] = m.group(1)
            body["metadata"]["uid"] = "slice-" + m.group(1)
            with lock:
                with open(os.path.join(slices, m.group(1) + ".json"), "w", encoding="utf-8") as f:
                    json.dump(body, f, indent=1)
            self.send(200, body)

        def do_DELETE(self):
            m = slice_re.match(urlparse(self.path).path)
            if not m:
                return self.not_found(self.path)
            with lock:
                try:
                    os.remove(os.path.join(slices, m.group(1) + ".json"))
                except FileNotFoundError:
                    return self.not_found(m.group(1))
            self.send(200, {"kind": "Status", "apiVersion": "v1", "status": "Success"})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    with open(portfile + ".tmp", "w", encoding="utf-8") as f:
        f.write(str(server.server_address[1]))
    os.rename(portfile + ".tmp", portfile)
    server.serve_forever()


def main(argv):
    import grpc

    if "KUBELET_GEN" in os.environ:
        sys.path.insert(0, os.environ["KUBELET_GEN"])

    try:
        if len(argv) == 3 and argv[0] == "gen":
            gen(argv[1], argv[2])
        elif len(argv) == 2 and argv[0] == "register":
            register(argv[1])
        elif len(argv) >= 4 and argv[0] == "prepare":
            prepare(argv[1], argv[2], argv[3:])
        elif len(argv) >= 3 and argv[0] == "unprepare":
            unprepare(argv[1], argv[2:])
        elif len(argv) == 3 and argv[0] == "apiserver":
            apiserver(argv[1], argv[2])
        else:
            sys.exit(__doc__)
    except grpc.RpcError as e:
        sys.exit(f"kubelet.py: {argv[0]}: {e.code().name}: {e.details()}")


if __name__ == "__main__":
    main(sys.argv[1:])
