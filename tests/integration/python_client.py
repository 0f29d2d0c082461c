#!/usr/bin/python3
"""A client written against the .proto with Debian's python3-grpcio: streams one
Generate call through the router and checks the stream is well formed. With --tls-ca it
connects over TLS (verifying the router against that CA), with --api-key it sends
'authorization: Bearer KEY' on every call."""
import argparse
import sys

p = argparse.ArgumentParser()
p.add_argument("--addr", required=True)
p.add_argument("--stubs", required=True, help="directory with tandem/v1/*_pb2*.py")
p.add_argument("--tls-ca", help="PEM CA certificate: connect over TLS")
p.add_argument("--api-key", help="API key sent as a Bearer token")
args = p.parse_args()
sys.path.insert(0, args.stubs)

import grpc  # noqa: E402
from tandem.v1 import generation_pb2 as g  # noqa: E402
from tandem.v1 import generation_pb2_grpc as gg  # noqa: E402

if args.tls_ca:
    with open(args.tls_ca, "rb") as f:
        channel = grpc.secure_channel(args.addr, grpc.ssl_channel_credentials(root_certificates=f.read()))
else:
    channel = grpc.insecure_channel(args.addr)
if args.api_key:
    # Explicit metadata on each call (an interceptor): gRPC attaches call credentials to
    # TLS channels only, and the key must reach plaintext routers too.
    import collections

    class _Details(collections.namedtuple("_Details", ("method", "timeout", "metadata", "credentials",
                                                       "wait_for_ready", "compression")),
                   grpc.ClientCallDetails):
        pass

    class _WithKey(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
        def _add(self, d):
            md = list(d.metadata or []) + [("authorization", "Bearer " + args.api_key)]
            return _Details(d.method, d.timeout, md, d.credentials, d.wait_for_ready, d.compression)

        def intercept_unary_unary(self, continuation, details, request):
            return continuation(self._add(details), request)

        def intercept_unary_stream(self, continuation, details, request):
            return continuation(self._add(details), request)

    channel = grpc.intercept_channel(channel, _WithKey())
stub = gg.GenerationStub(channel)
models = stub.ListModels(g.ListModelsRequest(), timeout=10)
assert models.models and models.models[0].vocab_size > 0, models
ids = stub.Tokenize(g.TokenizeRequest(text="Hello from Python"), timeout=10).ids
text = stub.Detokenize(g.DetokenizeRequest(ids=ids, skip_special_tokens=True), timeout=10).text
assert text == "Hello from Python", repr(text)

req = g.GenerateRequest(text="Hello from Python", sampling=g.SamplingParams(temperature=0.0),
                        stop=g.StopConditions(max_tokens=8, ignore_eos=True))
tokens, text, final = [], "", None
call = stub.Generate(req, timeout=60)
for msg in call:
    tokens.extend(msg.token_ids)
    text += msg.text
    if msg.finish_reason:
        final = msg
assert final is not None, "no final message"
assert final.usage.completion_tokens == len(tokens), (final.usage, len(tokens))
metadata = dict(call.initial_metadata())
assert "x-request-id" in metadata, metadata

try:
    list(stub.Generate(g.GenerateRequest(text="x", sampling=g.SamplingParams(temperature=float("nan"))), timeout=10))
    sys.exit("NaN temperature was accepted")
except grpc.RpcError as e:
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e
    assert "sampling.temperature" in e.details(), e.details()

print(f"finish_reason={g.FinishReason.Name(final.finish_reason)} tokens={len(tokens)} text={text!r}")
