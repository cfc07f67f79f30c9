"""Cross-checks responses_vectors.json (hand-derived) against vLLM's own
Responses input conversion: construct_input_messages and
should_continue_final_message from vllm/entrypoints/openai/responses/utils.py
(the commit named in docs/tokenizer.md), copied to a scratch directory as
utils_conv.py with stand-ins for the openai package's types, which this
machine cannot install. The stand-ins reproduce vLLM's parsing as read, not
run: function_call items become ResponseFunctionToolCall (the request's
function_call_parsing validator), every other item stays a dict. Tools are
not checked (they need the openai package's FunctionTool models).

The chat parser vLLM hands the messages to reads only role, content,
tool_calls, tool_call_id, name and reasoning, so other keys of a pass-through
item (its "type", "status", "id") are dropped before comparing.

Usage: python3 check_responses_vectors.py SCRATCH_DIR; exit 1 on a mismatch.
"""
import json
import os
import sys

sys.path.insert(0, sys.argv[1])
import utils_conv as u  # noqa: E402

KEYS = ("role", "content", "tool_calls", "tool_call_id", "name", "reasoning")
here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "responses_vectors.json"), encoding="utf-8") as f:
    vectors = json.load(f)

bad = 0
for v in vectors:
    body = v["body"]
    inp = body["input"]
    if isinstance(inp, list):
        inp = [u.ResponseFunctionToolCall(**i) if isinstance(i, dict) and i.get("type") == "function_call" else i for i in inp]
    msgs = u.construct_input_messages(request_instructions=body.get("instructions"), request_input=inp)
    msgs = [{k: m[k] for k in KEYS if k in m} for m in msgs]
    cont = u.should_continue_final_message(inp)
    ok = msgs == v["messages"] and cont == v.get("continue_final_message", False)
    print(("ok  " if ok else "BAD ") + v["name"])
    if not ok:
        bad += 1
        print("  vLLM:", json.dumps(msgs), "continue:", cont)
        print("  want:", json.dumps(v["messages"]), "continue:", v.get("continue_final_message", False))
sys.exit(1 if bad else 0)
