// Writes pkg/tokenizer/testdata/{corpus,extra}.llama2.ids (add_special_tokens
// false) and corpus.llama2.special.ids (true) with the HuggingFace reference:
// the SentencePiece-style BPE path (Prepend/Replace normalizer, byte
// fallback, TemplateProcessing BOS).
import { Tokenizer } from "@huggingface/tokenizers";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const td = path.join(path.dirname(fileURLToPath(import.meta.url)), "..", "..", "pkg", "tokenizer", "testdata");
const tok = new Tokenizer(JSON.parse(fs.readFileSync(path.join(td, "llama2", "tokenizer.json"), "utf8")),
  JSON.parse(fs.readFileSync(path.join(td, "llama2", "tokenizer_config.json"), "utf8")));
const read = (f) => fs.readFileSync(path.join(td, f), "utf8").trim().split("\n").map((l) => JSON.parse(l));
const write = (f, texts, special) => fs.writeFileSync(path.join(td, f),
  texts.map((t) => JSON.stringify(tok.encode(t, { add_special_tokens: special }).ids)).join("\n") + "\n");
write("corpus.llama2.ids", read("corpus.jsonl"), false);
write("extra.llama2.ids", read("extra.jsonl"), false);
write("corpus.llama2.special.ids", read("corpus.jsonl"), true);
