// Prints, as JSON, every code point with a non-zero canonical combining class
// in the Unicode version of this node's ICU (node 20 / ICU 78.2: Unicode
// 17.0), with that class: [[cp, ccc], ...]. JavaScript has no ccc API, so the
// class is measured through String.prototype.normalize("NFD") (canonical
// ordering is a stable sort by ccc): a mark M has class m > x exactly when
// NFD("a" + M + X) moves X before M, for a reference mark X of class x.
// The reference marks (one per class, argv[2] as JSON [[ccc, cp], ...]) come
// from Python's unicodedata; a class between two reference classes is
// reported as the lower bound + 0.5 and fails TestRecentCCC.
//
//   testdata/ccc_reference_marks.json: [[ccc, cp], ...], one mark without a
//   decomposition per class, from /usr/bin/python3 unicodedata (Unicode 14):
//   for cp in range(0x110000): c = combining(chr(cp)); first cp per c.
//   node gen_ccc_tables.mjs testdata/ccc_reference_marks.json > testdata/ccc_nonzero.json
import fs from "node:fs";

const reps = JSON.parse(fs.readFileSync(process.argv[2], "utf8")); // [[ccc, cp]]
const ch = (cp) => String.fromCodePoint(cp);
const swaps = (m, x) => ("a" + ch(m) + ch(x)).normalize("NFD") === "a" + ch(x) + ch(m);
const lowMark = 0x0334; // ccc 1
const highMark = 0x0345; // ccc 240
const out = [];
for (let cp = 0; cp <= 0x10ffff; cp++) {
  if (cp >= 0xd800 && cp <= 0xdfff) continue;
  const s = ch(cp);
  if (s.normalize("NFD") !== s) continue; // has a decomposition: x/text knows it
  if (!swaps(cp, lowMark) && !swaps(highMark, cp)) continue; // class 0
  let ccc = null;
  for (const [x, ref] of reps) {
    if (ref === cp) { ccc = x; break; }
    const gt = swaps(cp, ref), lt = swaps(ref, cp);
    if (!gt && !lt) { ccc = x; break; }
    if (lt) { ccc = null; break; }
  }
  if (ccc === null) {
    let lower = 0;
    for (const [x, ref] of reps) if (swaps(cp, ref)) lower = x;
    ccc = lower + 0.5;
  }
  out.push([cp, ccc]);
}
process.stdout.write(JSON.stringify(out) + "\n");
