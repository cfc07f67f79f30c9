// Generates pkg/tokenizer/testdata/extra.jsonl and extra.<tokenizer>.ids with
// the HuggingFace reference (@huggingface/tokenizers, see package.json),
// add_special_tokens=false. Deterministic (seeded PRNG).
//
//   npm ci && node gen_expectations.mjs [war_and_peace.jsonl] [codepoints.txt]
//
// codepoints.txt (optional): hex code points, one per line, to sample as
// "recently added" characters (kvgate used those where Go's unicode tables
// and this engine's disagree).
import { Tokenizer } from "@huggingface/tokenizers";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const testdata = path.join(here, "..", "..", "pkg", "tokenizer", "testdata");
const warPath = process.argv[2] ?? "/work/shared/vectors/tokenizer/bench_war_and_peace.jsonl";
const cpPath = process.argv[3];

let seed = 0x6b766761;
const rand = () => {
  seed = (seed + 0x6d2b79f5) | 0;
  let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
  t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
};
const pick = (a) => a[Math.floor(rand() * a.length)];
const range = (lo, hi) => String.fromCodePoint(lo + Math.floor(rand() * (hi - lo + 1)));

const texts = [];
const add = (s) => { if (s.length > 0) texts.push(s); };

// Long documents.
if (fs.existsSync(warPath)) {
  const paras = fs.readFileSync(warPath, "utf8").trim().split("\n").map((l) => JSON.parse(l));
  for (let i = 0; i < 6; i++) {
    const start = Math.floor(rand() * (paras.length - 200));
    add(paras.slice(start, start + 20 + i * 30).join(pick(["\n\n", "\n", " ", "\r\n\r\n"])));
  }
}

// Code.
add(`package main

import (
\t"fmt"
\t"os"
)

// main prints its arguments.
func main() {
\tfor i, a := range os.Args[1:] {
\t\tfmt.Printf("%d: %q\\n", i, a) // 0x1F, 1e-9, 3.14159
\t}
\tif len(os.Args) == 0 { panic("impossible") }
}
`);
add(`def fib(n: int) -> int:\n    """Return the n-th Fibonacci number."""\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n\nif __name__ == '__main__':\n    print([fib(i) for i in range(20)])\n`);
add(`{"model":"Qwen/Qwen3-0.6B","messages":[{"role":"user","content":"Hi!\\n\\tHow's it going?"}],"max_tokens":12345678,"temperature":0.7}`);
add(`<div class="x" id='y'>\n  <p>&amp; &lt;tag&gt; &#x1F600;</p>\n</div>\n<script>const re = /[^\\s\\p{L}]+/gu; let s = \`\${a}--\${b}\`;</script>`);
add("SELECT u.id, COUNT(*) AS n\nFROM users u\n\tJOIN orders o ON o.user_id = u.id\nWHERE u.created_at >= '2024-01-01'\nGROUP BY 1\nHAVING n > 10;;\n\n\n");
add("fn main() {\n    let v: Vec<u32> = (0..1_000_000).filter(|x| x % 7 == 0).collect();\n    println!(\"{:?}\", &v[..3]);\n}\r\n");
add("#!/bin/sh\nset -eu\nfor f in *.txt; do\n  wc -l \"$f\" | awk '{print $1}'   # count\ndone 2>/dev/null ||  true\n");

// CJK, emoji, scripts.
add("我们今天在北京天安门广场拍照。明天去上海！价格是１２３４５元，约合US$1,700.");
add("日本語のテキストとカタカナ、ひらがな。漢字も含む：東京都渋谷区　全角スペース　も。");
add("한국어 문장입니다. 띄어쓰기 와 숫자 2024년 12월 31일.");
add("👨‍👩‍👧‍👦 family, 🏳️‍🌈 flag, 🇯🇵🇺🇸 flags, 👍🏻👍🏿 tones, 🤖🫠🫨🪿 new emoji, ❤️‍🔥 and 1️⃣ keycap");
add("Ελληνικά κείμενα, русский текст, עברית, العربية ١٢٣٤٥٦٧, हिन्दी ०१२३, ไทยภาษา, ქართული");
add("Mathematical 𝔸𝕓𝕔 𝟘𝟙𝟚 ∑∫∂ √2 ≈ 1.41421356 ½ ¾ Ⅻ ⅷ ① ⑳ ²³");

// Whitespace runs and contractions.
add("a  b   c    d\t\te\t \tf\n \ng\r\r\n\n h\u00a0\u00a0i\u2003\u2003j\u3000\u3000k\u0085l\u2028m\u2029n\ufeffo");
add("    \n\n\t\t  \r\n   x   \n");
add("\n\n\n\n\n\n\n\n\n\n\n\n");
add("                                                                                 end");
add("I'M HE'S SHE'D WE'LL THEY'RE YOU'VE it'S iT's 'tis o'clock ''s '' ' s ſ 'ſ 'ſt 'K 'k");
add("don’t (curly) vs don't; l'été; rock 'n' roll; '99; x'''y");

// Special tokens in context.
add("<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nhi <|im_end|><|im_start|>assistant\n<think>\n\n</think>\n\n");
add("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhello<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
add("partial <|im_start <|im_end| |im_end|> <|endoftext|><|endoftext|>x<|endoftext|> <|reserved_special_token_5|>");
add("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>");

// NFC/NFD.
add("e\u0301 a\u0300 o\u0308 n\u0303 A\u030a \u1100\u1161\u11a8 \u0915\u093c \u00c5 \u212b \u2126 q\u0307\u0323");

// Numbers.
add("1 12 123 1234 12345 123456 1234567 3.14159265358979 -0.5e-10 1,000,000 ١٢٣٤٥ ０１２３４５ 𝟏𝟐𝟑𝟒");

// Recently added Unicode characters (15.1, 16.0, 17.0).
const recent = [
  [0x2ebf0, 0x2ee5d], // CJK Ext I (15.1)
  [0x10d40, 0x10d8f], // Garay (16.0)
  [0x16100, 0x16139], // Gurung Khema (16.0)
  [0x16d40, 0x16d79], // Kirat Rai (16.0)
  [0x1e5d0, 0x1e5fa], // Ol Onal (16.0)
  [0x11bc0, 0x11be1], // Sunuwar (16.0)
  [0x105c0, 0x105f3], // Todhri (16.0)
  [0x11380, 0x113e2], // Tulu-Tigalari (16.0)
  [0x1fa89, 0x1fa8f], // emoji (16.0)
  [0x323b0, 0x3347f], // CJK Ext J (17.0)
  [0x10940, 0x1095f], // Sidetic (17.0)
  [0x1e6c0, 0x1e6ff], // Tai Yo (17.0)
  [0x16ea0, 0x16edf], // Beria Erfe (17.0)
  [0x11db0, 0x11def], // Tolong Siki (17.0)
];
for (const [lo, hi] of recent) {
  let s = "";
  for (let i = 0; i < 24; i++) s += pick(["", " ", "", "x", "1", ".", "\n"]) + range(lo, hi);
  add(s);
}
if (cpPath && fs.existsSync(cpPath)) {
  const cps = fs.readFileSync(cpPath, "utf8").trim().split("\n").map((h) => parseInt(h, 16));
  for (let n = 0; n < 40; n++) {
    let s = "";
    for (let i = 0; i < 30; i++) s += pick([" ", "", "", "a", "'s", "7", "!", " \n"]) + String.fromCodePoint(pick(cps));
    add(s);
  }
}

// Random mixes over tricky classes.
const atoms = [" ", "  ", "\t", "\n", "\r\n", "\u00a0", "\u3000", "\u2009", "a", "Z", "é", "ß", "ǅ", "中", "ア", "한", "1", "٣", "½",
  "'", "'s", "'LL", "'Re", "!", "?", "...", "-", "_", "$", "€", "😀", "👍🏽", "\u200d", "\u0301", "<", "|", ">", "<|im_end|>",
  "<|endoftext|>", "<|eot_id|>", "\u2028", "\u0085", "\ufeff", "\u00ad", "ſ", "\u212a", "İ", "ﬁ", "\u{10D50}", "\u{2EBF0}", "\u{323B0}"];
for (let n = 0; n < 300; n++) {
  let s = "";
  const len = 1 + Math.floor(rand() * 40);
  for (let i = 0; i < len; i++) s += pick(atoms);
  add(s);
}

// Canonical compositions added in Unicode 16.0 (Qwen3 normalizes with NFC).
const nfcAtoms = [0x105d2, 0x105da, 0x105c9, 0x11382, 0x113c9, 0x11384, 0x113bb, 0x1138b, 0x113c2, 0x11390, 0x113b8, 0x113c5,
  0x1611e, 0x16129, 0x1611f, 0x16120, 0x16121, 0x16d67, 0x16d63, 0x16d69, 0x0307, 0x0323, 0x0020, 0x0061];
for (let n = 0; n < 40; n++) {
  let s = "";
  const len = 2 + Math.floor(rand() * 10);
  for (let i = 0; i < len; i++) s += String.fromCodePoint(pick(nfcAtoms));
  add(s);
}

const names = ["qwen3", "llama3"];
const out = {};
for (const name of names) {
  const json = JSON.parse(fs.readFileSync(path.join(testdata, name, "tokenizer.json"), "utf8"));
  const cfg = JSON.parse(fs.readFileSync(path.join(testdata, name, "tokenizer_config.json"), "utf8"));
  const tok = new Tokenizer(json, cfg);
  out[name] = texts.map((t) => JSON.stringify(tok.encode(t, { add_special_tokens: false }).ids));
}
fs.writeFileSync(path.join(testdata, "extra.jsonl"), texts.map((t) => JSON.stringify(t)).join("\n") + "\n");
for (const name of names) fs.writeFileSync(path.join(testdata, `extra.${name}.ids`), out[name].join("\n") + "\n");
console.error(`${texts.length} texts`);
