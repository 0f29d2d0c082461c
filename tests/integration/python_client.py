#!/usr/bin/python3
"""A client written against the .proto with Debian's python3-grpcio: streams one
Generate call through the router and checks the stream is well formed."""
import argparse
import sys

p = argparse.ArgumentParser()
p.add_argument("--addr", required=True)
p.add_argument("--stubs", required=True, help="directory with tandem/v1/*_pb2*.py")
args = p.parse_args()
sys.path.insert(0, args.stubs)

import grpc  # noqa: E402
from tandem.v1 import generation_pb2 as g  # noqa: E402
from tandem.v1 import generation_pb2_grpc as gg  # noqa: E402

stub = gg.GenerationStub(grpc.insecure_channel(args.addr))
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
