// Tokenizes the Jinja2 reference renders of the chat cases with the
// HuggingFace reference (add_special_tokens=false, as vLLM encodes chat
// prompts) and writes pkg/tokenizer/testdata/chat_expected.jsonl.
//
//   node gen_chat_expectations.mjs <chat_cases.json> <expected_jinja2.json>
//
// The inputs are pkg/chattemplate's committed cases and their renders by
// Python Jinja2 with transformers' settings (see pkg/chattemplate).
import { Tokenizer } from "@huggingface/tokenizers";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const testdata = path.join(here, "..", "..", "pkg", "tokenizer", "testdata");
const cases = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
const expected = JSON.parse(fs.readFileSync(process.argv[3], "utf8")).cases;
const toks = {};
for (const name of ["qwen3", "llama3"]) {
  const json = JSON.parse(fs.readFileSync(path.join(testdata, name, "tokenizer.json"), "utf8"));
  const cfg = JSON.parse(fs.readFileSync(path.join(testdata, name, "tokenizer_config.json"), "utf8"));
  toks[name] = new Tokenizer(json, cfg);
}
const lines = [];
for (const c of cases) {
  const e = expected[c.name];
  if (!e || e.render === undefined || !toks[c.template]) continue;
  const ids = toks[c.template].encode(e.render, { add_special_tokens: false }).ids;
  lines.push(JSON.stringify({ name: c.name, template: c.template, render: e.render, ids }));
}
fs.writeFileSync(path.join(testdata, "chat_expected.jsonl"), lines.join("\n") + "\n");
console.error(`${lines.length} chat cases`);
