#!/usr/bin/python3
"""Side-by-side timing of the Qwen3 20-turn chat render in Python Jinja2 (as
transformers configures it), for comparison with
`go test -bench RenderChatQwen3TwentyTurns ./pkg/chattemplate`.
Prints the median of 7 runs of 2000 renders, in microseconds per render."""
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_reference import TESTDATA, make_env, vllm_parse_messages  # noqa: E402


def twenty_turns():
    msgs = [{"role": "system", "content": "You are a helpful assistant."}]
    for i in range(20):
        msgs.append({"role": "user", "content": f"Question {i}: what is {i} squared, and why? Explain step by step."})
        if i < 19:
            msgs.append({"role": "assistant", "content": f"<think>\nCompute {i}*{i}.\n</think>\n\n{i} squared is {i * i} because multiplying {i} by itself gives {i * i}."})
    return msgs


def main():
    with open(os.path.join(TESTDATA, "qwen3_tokenizer_config.json"), encoding="utf-8") as f:
        src = json.load(f)["chat_template"]
    tmpl = make_env().from_string(src)
    raw = twenty_turns()
    n = 2000
    runs = []
    for _ in range(7):
        t0 = time.process_time()
        for _ in range(n):
            msgs = vllm_parse_messages(raw)
            tmpl.render(messages=msgs, tools=None, documents=None, add_generation_prompt=True,
                        eos_token="<|im_end|>", pad_token="<|endoftext|>")
        runs.append((time.process_time() - t0) / n * 1e6)
    print(f"python jinja2 qwen3 20-turn render: median {statistics.median(runs):.1f} us CPU/render (runs: {', '.join(f'{r:.0f}' for r in runs)})")


if __name__ == "__main__":
    main()
