// Side-by-side benchmark of the HuggingFace JS reference
// (@huggingface/tokenizers, see package.json) on the inputs of
// pkg/tokenizer's Go benchmarks (BenchmarkWarAndPeace, BenchmarkLongPrompt).
// Prints one line per case: name, median ms, MB/s, tokens/s.
//
//   node bench.mjs [rounds]
import { Tokenizer } from "@huggingface/tokenizers";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const testdata = path.join(here, "..", "..", "pkg", "tokenizer", "testdata");
const rounds = Number(process.argv[2] ?? 3);
let corpus = path.join(testdata, "bench_war_and_peace.jsonl");
if (!fs.existsSync(corpus)) corpus = "/work/shared/vectors/tokenizer/bench_war_and_peace.jsonl";
const paras = fs.readFileSync(corpus, "utf8").trim().split("\n").map((l) => JSON.parse(l));
const enc = new TextEncoder();
const bytesOf = (s) => enc.encode(s).length;
const totalBytes = paras.reduce((n, p) => n + bytesOf(p), 0);

const load = (name) => {
  const json = JSON.parse(fs.readFileSync(path.join(testdata, name, "tokenizer.json"), "utf8"));
  const cfg = JSON.parse(fs.readFileSync(path.join(testdata, name, "tokenizer_config.json"), "utf8"));
  return () => new Tokenizer(json, cfg);
};
const median = (a) => { const s = [...a].sort((x, y) => x - y); return s[Math.floor(s.length / 2)]; };
const report = (name, msList, bytes, tokens) => {
  const ms = median(msList);
  console.log(`${name}\t${ms.toFixed(3)} ms\t${(bytes / 1e6 / (ms / 1e3)).toFixed(2)} MB/s\t${Math.round(tokens / (ms / 1e3))} tokens/s`);
};
const time = (fn) => { const t0 = process.hrtime.bigint(); fn(); return Number(process.hrtime.bigint() - t0) / 1e6; };

for (const name of ["qwen3", "llama3"]) {
  const make = load(name);
  // War and Peace, paragraph by paragraph: cold = fresh instance, warm = second pass.
  let tokens = 0;
  const cold = [], warm = [];
  for (let r = 0; r < rounds; r++) {
    const tok = make();
    let n = 0;
    cold.push(time(() => { for (const p of paras) n += tok.encode(p, { add_special_tokens: false }).ids.length; }));
    tokens = n;
    warm.push(time(() => { for (const p of paras) tok.encode(p, { add_special_tokens: false }); }));
  }
  report(`js/WarAndPeace/${name}/cold`, cold, totalBytes, tokens);
  report(`js/WarAndPeace/${name}/warm`, warm, totalBytes, tokens);

  // A 32k-token prompt built as in the Go benchmark.
  const t0 = make();
  let prompt = "", count = 0;
  for (let i = 100; count < 32000; i = (i + 1) % paras.length) {
    prompt += paras[i] + "\n\n";
    count += t0.encode(paras[i] + "\n\n", { add_special_tokens: false }).ids.length;
  }
  const ptoks = t0.encode(prompt, { add_special_tokens: false }).ids.length;
  const pbytes = bytesOf(prompt);
  const lc = [], lr = [], lw = [];
  const seen = prompt.slice(0, Math.floor(prompt.length * 0.9));
  let seed = 7;
  const rnd = (n) => { seed = (Math.imul(seed, 1103515245) + 12345) >>> 0; return (seed >>> 8) % n; };
  for (let r = 0; r < rounds; r++) {
    const tok = make();
    lc.push(time(() => tok.encode(prompt, { add_special_tokens: false })));
    lr.push(time(() => tok.encode(prompt, { add_special_tokens: false })));
    tok.encode(seen, { add_special_tokens: false });
    let suffix = "";
    while (suffix.length < prompt.length / 10) suffix += paras[1000 + rnd(paras.length - 1000)] + "\n\n";
    suffix = suffix.slice(0, Math.floor(prompt.length / 10));
    lw.push(time(() => tok.encode(seen + suffix, { add_special_tokens: false })));
  }
  report(`js/LongPrompt/${name}/cold/${ptoks}tokens`, lc, pbytes, ptoks);
  report(`js/LongPrompt/${name}/repeat/${ptoks}tokens`, lr, pbytes, ptoks);
  report(`js/LongPrompt/${name}/warm90/${ptoks}tokens`, lw, pbytes, ptoks);
}
