// Summarizes run.sh's raw outputs: per case, the median MB/s and tokens/s of
// Go and JS over the rounds, and the median of the per-round Go/JS ratios.
import fs from "node:fs";

const [goFile, jsFile] = process.argv.slice(2);
const median = (a) => { const s = [...a].sort((x, y) => x - y); return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2; };
const goRows = {}, jsRows = {};
for (const line of fs.readFileSync(goFile, "utf8").trim().split("\n")) {
  const m = line.match(/^Benchmark(\S+?)-\d+\s+\d+\s+([\d.]+) ns\/op\s+([\d.]+) MB\/s\s+([\d.]+) tokens\/s/);
  if (m) (goRows[m[1]] ??= []).push({ ms: m[2] / 1e6, mbs: +m[3], tps: +m[4] });
}
for (const line of fs.readFileSync(jsFile, "utf8").trim().split("\n")) {
  const m = line.match(/^js\/(\S+)\t([\d.]+) ms\t([\d.]+) MB\/s\t(\d+) tokens\/s/);
  if (m) (jsRows[m[1]] ??= []).push({ ms: +m[2], mbs: +m[3], tps: +m[4] });
}
const pad = (s, n) => String(s).padEnd(n);
console.log(pad("case", 44) + pad("go ms", 10) + pad("go MB/s", 10) + pad("go tok/s", 12) + pad("js ms", 10) + pad("js MB/s", 9) + pad("js tok/s", 11) + "go/js");
for (const [name, g] of Object.entries(goRows)) {
  const j = jsRows[name];
  const gm = median(g.map((r) => r.ms)), gmb = median(g.map((r) => r.mbs)), gt = median(g.map((r) => r.tps));
  let jsCols = pad("-", 10) + pad("-", 9) + pad("-", 11) + "-";
  if (j) {
    const n = Math.min(g.length, j.length);
    const ratios = []; for (let i = 0; i < n; i++) ratios.push(g[i].mbs / j[i].mbs);
    jsCols = pad(median(j.map((r) => r.ms)).toFixed(1), 10) + pad(median(j.map((r) => r.mbs)).toFixed(2), 9) +
      pad(Math.round(median(j.map((r) => r.tps))), 11) + median(ratios).toFixed(1) + "x";
  }
  console.log(pad(name, 44) + pad(gm.toFixed(2), 10) + pad(gmb.toFixed(1), 10) + pad(Math.round(gt), 12) + jsCols);
}
