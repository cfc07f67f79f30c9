// Writes pkg/tokenizer/testdata/nfc_recent.jsonl: [input, NFC(input)] pairs
// from the JS engine (Unicode 17) for the scripts whose canonical compositions
// were added after Unicode 15.0 (Todhri, Tulu-Tigalari, Gurung Khema, Kirat
// Rai), mixed with combining marks. Deterministic.
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const out = path.join(here, "..", "..", "pkg", "tokenizer", "testdata", "nfc_recent.jsonl");
let seed = 99;
const rnd = (n) => { seed = (Math.imul(seed, 1103515245) + 12345) >>> 0; return (seed >>> 8) % n; };
const atoms = [0x105d2, 0x105da, 0x105c9, 0x11382, 0x113c9, 0x11384, 0x113bb, 0x1138b, 0x113c2, 0x11390, 0x113b8, 0x113c5,
  0x1611e, 0x16129, 0x1611f, 0x16120, 0x16121, 0x16d67, 0x16d63, 0x16d69, 0x0307, 0x0323, 0x0301, 0x0327, 0x0041, 0x0020, 0x0065];
const lines = [];
for (let n = 0; n < 400; n++) {
  let s = "";
  const len = 1 + rnd(8);
  for (let i = 0; i < len; i++) s += String.fromCodePoint(atoms[rnd(atoms.length)]);
  lines.push(JSON.stringify([s, s.normalize("NFC")]));
}
fs.writeFileSync(out, lines.join("\n") + "\n");
