#!/usr/bin/python3
"""Reference renders for pkg/chattemplate, produced by Python Jinja2 exactly as
HuggingFace transformers configures it (the engine vLLM runs).

Run with Debian's interpreter (python3-jinja2):  /usr/bin/python3 gen_reference.py
It writes, under pkg/chattemplate/testdata/:
  chat_cases.json       inputs: the request (messages, tools, flags, kwargs) and
                        the variables vLLM would hand to the template
  jinja_cases.json      feature snippets (template + variables) for raw renders
  expected_jinja2.json  {case name: {"render": str} | {"error": str}}
Then run `node gen_reference.mjs` for the @huggingface/jinja renders.

The message preprocessing below mirrors vLLM's parse_chat_messages for text-only
chats (vllm/entrypoints/chat_utils.py) and the tool dicts mirror pydantic's
model_dump of ChatCompletionToolsParam; the render and continue_final_message
handling mirror transformers' chat_template_utils.
"""
import copy
import datetime
import json
import os
import sys

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
TESTDATA = os.path.join(HERE, "..", "..", "pkg", "chattemplate", "testdata")
FIXED_NOW = datetime.datetime(2026, 3, 5, 14, 7, 9)


def make_env():
    """transformers' _compile_jinja_template environment."""
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return FIXED_NOW.strftime(format)

    class AssistantTracker(jinja2.ext.Extension):
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

        def _render(self, caller):
            return caller()

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[AssistantTracker, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


TEXT_PARTS = {"text": "text", "input_text": "text", "output_text": "text", "refusal": "refusal", "thinking": "thinking"}


# --- vLLM's content-format detection (chat_utils._detect_content_format) ---

def _is_var_access(node, varname):
    if isinstance(node, jinja2.nodes.Name):
        return node.ctx == "load" and node.name == varname
    return False


def _is_attr_access(node, varname, key):
    if isinstance(node, jinja2.nodes.Getitem):
        return (_is_var_access(node.node, varname) and isinstance(node.arg, jinja2.nodes.Const)
                and node.arg.value == key)
    if isinstance(node, jinja2.nodes.Getattr):
        return _is_var_access(node.node, varname) and node.attr == key
    return False


def _is_var_or_elems_access(node, varname, key=None):
    if isinstance(node, jinja2.nodes.Filter):
        return node.node is not None and _is_var_or_elems_access(node.node, varname, key)
    if isinstance(node, jinja2.nodes.Test):
        return _is_var_or_elems_access(node.node, varname, key)
    if isinstance(node, jinja2.nodes.Getitem) and isinstance(node.arg, jinja2.nodes.Slice):
        return _is_var_or_elems_access(node.node, varname, key)
    return _is_attr_access(node, varname, key) if key else _is_var_access(node, varname)


def _iter_nodes_assign_var_or_elems(root, varname):
    yield root, varname
    related = [varname]
    while related:
        rv = related.pop(0)
        for assign in root.find_all(jinja2.nodes.Assign):
            if _is_var_or_elems_access(assign.node, rv):
                assert isinstance(assign.target, jinja2.nodes.Name)
                yield assign, assign.target.name
                if assign.target.name != rv:
                    related.append(assign.target.name)


def _iter_nodes_assign_messages_item(root):
    names = [v for _, v in _iter_nodes_assign_var_or_elems(root, "messages")]
    for loop in root.find_all(jinja2.nodes.For):
        for v in names:
            if _is_var_or_elems_access(loop.iter, v):
                assert isinstance(loop.target, jinja2.nodes.Name)
                yield loop, loop.target.name
                break


def _iter_nodes_assign_content_item(root):
    names = [v for _, v in _iter_nodes_assign_messages_item(root)]
    for loop in root.find_all(jinja2.nodes.For):
        for v in names:
            if _is_var_or_elems_access(loop.iter, v, "content"):
                assert isinstance(loop.target, jinja2.nodes.Name)
                yield loop, loop.target.name
                break


def detect_content_format(env, src):
    try:
        ast = env.parse(src)
        next(_iter_nodes_assign_content_item(ast))
    except StopIteration:
        return "string"
    except Exception:  # noqa: BLE001 - vLLM falls back to its default
        return "string"
    return "openai"


def vllm_parse_messages(messages, content_format="string"):
    """vLLM parse_chat_messages + _postprocess_messages for text-only chats."""
    wrap = content_format == "openai"
    out = []
    for m in copy.deepcopy(messages):
        role = m["role"]
        content = m.get("content")
        reasoning = m.get("reasoning")
        if content is None:
            content = []
        elif isinstance(content, str):
            content = [{"type": "text", "text": content}]
        texts = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
                continue
            key = TEXT_PARTS[part["type"]]
            val = part.get(key)
            if val is None and part["type"] in ("text", "refusal"):
                continue
            texts.append(val)
        if wrap:
            msg = {"role": role, "content": [{"type": "text", "text": t} for t in texts]}
        else:
            msg = {"role": role, "content": "\n".join(texts)}
        if role == "assistant":
            if m.get("tool_calls") is not None:
                msg["tool_calls"] = list(m["tool_calls"])
            if reasoning is not None:
                msg["reasoning"] = reasoning
                msg["reasoning_content"] = reasoning
        elif role == "tool":
            if "tool_call_id" in m:
                msg["tool_call_id"] = m["tool_call_id"]
            if isinstance(msg["content"], list):
                if not any(isinstance(i, dict) and i.get("type") != "text" for i in msg["content"]):
                    texts = [i.get("text", "") for i in msg["content"] if isinstance(i, dict) and i.get("type") == "text"]
                    msg["content"] = "\n".join(texts) if texts else ""
        if isinstance(m.get("name"), str):
            msg["name"] = m["name"]
        if isinstance(m.get("task"), str):
            msg["task"] = m["task"]
        out.append(msg)
    for msg in out:
        if msg["role"] == "assistant" and "tool_calls" in msg:
            calls = msg["tool_calls"]
            if not isinstance(calls, list):
                continue
            if len(calls) == 0:
                msg.pop("tool_calls")
                continue
            for item in calls:
                args = item["function"].get("arguments")
                if isinstance(args, str):
                    try:
                        item["function"]["arguments"] = json.loads(args)
                    except json.JSONDecodeError:
                        item["function"]["arguments"] = {}
                elif not isinstance(args, (dict, list)):
                    item["function"]["arguments"] = {}
    return out


def vllm_tool_dicts(tools, with_strict):
    """pydantic model_dump of ChatCompletionToolsParam (extra="allow")."""
    if tools is None:
        return None
    out = []
    for t in tools:
        fn = t["function"]
        f = {"name": fn["name"], "description": fn.get("description"), "parameters": fn.get("parameters")}
        if with_strict:
            f["strict"] = fn.get("strict")
        for k, v in fn.items():
            if k not in f:
                f[k] = v
        d = {"type": t.get("type", "function"), "function": f}
        for k, v in t.items():
            if k not in d:
                d[k] = v
        out.append(d)
    return out


def render_chat(env, template_src, case):
    """transformers apply_chat_template(tokenize=False) with vLLM's arguments."""
    tmpl = env.from_string(template_src)
    kwargs = dict(case.get("special_tokens", {}))
    kwargs.update(case.get("kwargs", {}))
    msgs = case["vars"]["messages"]
    rendered = tmpl.render(messages=msgs, tools=case["vars"]["tools"], documents=case.get("documents"),
                           add_generation_prompt=case.get("add_generation_prompt", False), **kwargs)
    if case.get("continue_final_message"):
        final = msgs[-1]["content"]
        if isinstance(final, (list, tuple)):
            for block in reversed(final):
                if "text" in block:
                    final = block["text"]
                    break
            else:
                raise ValueError("no text to continue")
        if final.strip() not in rendered:
            raise ValueError("final message not in render")
        loc = rendered.rindex(final.strip())
        if rendered[loc: loc + len(final.lstrip())] == final:
            rendered = rendered[: loc + len(final.lstrip())]
        else:
            rendered = rendered[: loc + len(final.strip())]
    return rendered


def main():
    sys.path.insert(0, HERE)
    from cases import chat_cases, jinja_cases, random_chat_cases, random_expression_cases  # noqa: E402

    env = make_env()
    templates = {}
    special = {}
    for name in ("qwen3", "llama3", "llama3_1", "gemma3", "deepseek_v3"):
        with open(os.path.join(TESTDATA, f"{name}_tokenizer_config.json"), encoding="utf-8") as f:
            cfg = json.load(f)
        templates[name] = cfg["chat_template"]
        special[name] = {k: cfg[k] for k in ("bos_token", "eos_token", "pad_token", "unk_token") if cfg.get(k) is not None}

    expected = {}
    chats = []
    for case in chat_cases() + random_chat_cases():
        case = dict(case)
        case.setdefault("special_tokens", special[case["template"]])
        case["content_format"] = detect_content_format(env, templates[case["template"]])
        case["vars"] = {
            "messages": vllm_parse_messages(case["messages"], case["content_format"]),
            "tools": vllm_tool_dicts(case.get("tools"), case.get("tools_strict_field", False)),
        }
        try:
            expected[case["name"]] = {"render": render_chat(env, templates[case["template"]], case)}
        except Exception as e:  # noqa: BLE001 - the error is the expectation
            expected[case["name"]] = {"error": f"{type(e).__name__}: {e}"}
        chats.append(case)

    snippets = []
    for case in jinja_cases() + random_expression_cases():
        try:
            # deepcopy: filters such as indent may mutate list arguments in place.
            expected[case["name"]] = {"render": env.from_string(case["template"]).render(**copy.deepcopy(case.get("vars", {})))}
        except Exception as e:  # noqa: BLE001
            expected[case["name"]] = {"error": f"{type(e).__name__}: {e}"}
        snippets.append(case)

    def dump(name, obj):
        with open(os.path.join(TESTDATA, name), "w", encoding="utf-8") as f:
            json.dump(obj, f, ensure_ascii=False, indent=1)
            f.write("\n")

    dump("chat_cases.json", chats)
    dump("jinja_cases.json", snippets)
    dump("expected_jinja2.json", {"engine": f"jinja2 {jinja2.__version__} (python {sys.version.split()[0]})",
                                  "fixed_now": FIXED_NOW.isoformat(), "cases": expected})
    print(f"{len(chats)} chat cases, {len(snippets)} snippets", file=sys.stderr)


if __name__ == "__main__":
    main()
