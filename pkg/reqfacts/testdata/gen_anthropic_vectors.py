"""Regenerates anthropic_vectors.json by running vLLM's own Anthropic
Messages conversion (AnthropicServingMessages._convert_system_message,
_convert_messages and _convert_tools, request parsing by its pydantic
AnthropicMessagesRequest) on the request bodies of anthropic_cases.json.

Usage: python3 gen_anthropic_vectors.py VLLM_ANTHROPIC_DIR
VLLM_ANTHROPIC_DIR holds protocol.py and serving_conv.py: vLLM's
vllm/entrypoints/anthropic/protocol.py and the conversion classmethods of
serving.py, copied from the commits named in docs/tokenizer.md (vLLM's code is
not part of this repository). Needs pydantic 2.
"""
import json
import os
import sys

sys.path.insert(0, sys.argv[1])
import protocol  # noqa: E402
import serving_conv  # noqa: E402

here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "anthropic_cases.json"), encoding="utf-8") as f:
    cases = json.load(f)


class Req:
    tool_choice = None
    tools = None


out = []
for case in cases:
    req = protocol.AnthropicMessagesRequest.model_validate(case["body"])
    msgs = []
    conv = serving_conv.AnthropicServingMessages
    conv._convert_system_message(req, msgs)
    conv._convert_messages(req.messages, msgs)
    r = Req()
    conv._convert_tools(req, r)
    out.append({"name": case["name"], "body": case["body"], "messages": msgs, "tools": r.tools})

with open(os.path.join(here, "anthropic_vectors.json"), "w", encoding="utf-8") as f:
    json.dump(out, f, ensure_ascii=False, indent=1)
    f.write("\n")
print(len(out), "vectors")
