// hftok.mjs DIR PKG LINES IDS - encode each line of LINES with the tokenizer.json of the
// model directory DIR, by Hugging Face's tokenizers.js (the package directory PKG, whose
// dist/tokenizers.mjs is loaded), and compare with the ids of the same line in IDS (one line
// of space-separated ids each); decoding the ids must give the line back. Exit 1 on the first
// difference, naming the line.
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";

const [dir, pkg, linesFile, idsFile] = process.argv.slice(2);
const { Tokenizer } = await import(pathToFileURL(`${pkg}/dist/tokenizers.mjs`).href);
const tj = JSON.parse(readFileSync(`${dir}/tokenizer.json`, "utf8"));
const tc = JSON.parse(readFileSync(`${dir}/tokenizer_config.json`, "utf8"));
const tok = new Tokenizer(tj, tc);
// tokenizers.js's Unigram has no byte fallback (the Rust tokenizers library, which
// transformers uses, has): lines that need byte pieces are left out for a Unigram model
const bytePiece = new Set();
if (tj.model.type === "Unigram")
  tj.model.vocab.forEach(([p], i) => { if (/^<0x[0-9A-F]{2}>$/.test(p)) bytePiece.add(i); });
let skipped = 0;
const lines = readFileSync(linesFile, "utf8").split("\n");
const ids = readFileSync(idsFile, "utf8").split("\n");
let n = 0;
for (let i = 0; i < lines.length; i++) {
  if (lines[i] === "" && (ids[i] ?? "") === "") continue;
  const want = ids[i].trim().split(/\s+/).map(Number);
  if (want.some((v) => bytePiece.has(v))) {
    skipped++;
    continue;
  }
  const got = tok.encode(lines[i], { add_special_tokens: false }).ids;
  if (got.length !== want.length || got.some((v, k) => v !== want[k])) {
    console.log(`line ${i + 1}: tokenizers.js gives ${got.slice(0, 12)}, expected ${want.slice(0, 12)}`);
    process.exit(1);
  }
  const back = tok.decode(got, { skip_special_tokens: false, clean_up_tokenization_spaces: false });
  if (back !== lines[i]) {
    console.log(`line ${i + 1}: decodes to ${JSON.stringify(back.slice(0, 60))}`);
    process.exit(1);
  }
  n++;
}
console.log(`tokenizers.js: ${n} lines encode to the same ids and decode back` +
  (skipped ? ` (${skipped} left out: byte pieces, which its Unigram lacks)` : ""));
