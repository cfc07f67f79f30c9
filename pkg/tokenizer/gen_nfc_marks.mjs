// Writes testdata/nfc_recent_marks.jsonl: [input, NFC, NFD, NFKC] per line
// from String.prototype.normalize on node 20 / ICU 78.2 (Unicode 17.0), for
// random sequences mixing base letters, precomposed letters, old combining
// marks and the marks Unicode 16.0/17.0 added (classes 9, 220, 230, 234),
// plus the Unicode 16.0 composition pairs. Deterministic (seeded PRNG).
//
//   node gen_nfc_marks.mjs > testdata/nfc_recent_marks.jsonl
let seed = 0x63636321;
const rand = () => {
  seed = (seed + 0x6d2b79f5) | 0;
  let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
  t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
};
const pick = (a) => a[Math.floor(rand() * a.length)];
const recentMarks = [0x0897, 0x1acf, 0x1ad5, 0x1add, 0x1ae0, 0x1ae6, 0x1aea, 0x1aeb, 0x10d69, 0x10d6d,
  0x10efa, 0x10efb, 0x113ce, 0x113d0, 0x1612f, 0x1e5ee, 0x1e5ef, 0x1e6e3, 0x1e6f5];
const oldMarks = [0x0301, 0x0300, 0x0308, 0x0316, 0x0323, 0x0327, 0x0334, 0x0345, 0x035c, 0x0362, 0x05b0, 0x093c, 0x094d, 0x1dce, 0x302a];
const bases = ["a", "e", "o", "u", "A", "E", "n", "s", "é", "ñ", "ǖ", "ệ", "क", "ɑ", "\u{11382}", "\u{1611e}", "\u{16d63}", "\u{105d2}", "가", " ", "1"];
const lines = [];
for (let i = 0; i < 600; i++) {
  let s = "";
  const n = 1 + Math.floor(rand() * 4);
  for (let k = 0; k < n; k++) {
    s += pick(bases);
    const m = Math.floor(rand() * 5);
    for (let j = 0; j < m; j++) s += String.fromCodePoint(rand() < 0.5 ? pick(recentMarks) : pick(oldMarks));
  }
  lines.push(JSON.stringify([s, s.normalize("NFC"), s.normalize("NFD"), s.normalize("NFKC")]));
}
process.stdout.write(lines.join("\n") + "\n");
