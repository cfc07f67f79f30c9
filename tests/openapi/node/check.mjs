// Validates docs/openapi.yaml with @apidevtools/swagger-parser (schema and
// $refs), then sends every request listed in the operations'
// x-kvgate-examples, in x-kvgate-order, to a live kvgate and validates each
// answer's status, content type and body against the document (ajv).
//
//   node check.mjs ../../../docs/openapi.yaml http://127.0.0.1:11111
//
// Prints one line per request and "N passed, M failed"; exits 1 on a failure.
import SwaggerParser from "@apidevtools/swagger-parser";
import Ajv from "ajv";
import addFormats from "ajv-formats";

const [docPath, base] = process.argv.slice(2);
if (!docPath || !base) {
  console.error("usage: node check.mjs OPENAPI.yaml BASE_URL");
  process.exit(2);
}

// validate() checks the document against the OpenAPI 3.0 schema and resolves
// every $ref; the result is the dereferenced document.
const api = await SwaggerParser.validate(docPath);
console.log(`document valid: OpenAPI ${api.openapi}, ${Object.keys(api.paths).length} paths`);

const ajv = new Ajv({ strict: false, allErrors: true });
addFormats(ajv);
const validators = new Map();
function validatorFor(schema) {
  if (!validators.has(schema)) validators.set(schema, ajv.compile(schema));
  return validators.get(schema);
}

const methods = ["get", "put", "post", "delete", "patch"];
const ops = [];
for (const [path, item] of Object.entries(api.paths)) {
  for (const m of methods) {
    const op = item[m];
    if (!op) continue;
    ops.push({ path, method: m.toUpperCase(), op });
  }
}
let passed = 0, failed = 0;
const fail = (what, why) => { failed++; console.log(`FAIL ${what}: ${why}`); };

for (const { path, method, op } of ops) {
  if (!Array.isArray(op["x-kvgate-examples"]) || op["x-kvgate-examples"].length === 0) {
    fail(`${method} ${path}`, "no x-kvgate-examples: every operation needs at least one example request");
  }
  if (typeof op["x-kvgate-order"] !== "number") fail(`${method} ${path}`, "no x-kvgate-order");
}
ops.sort((a, b) => (a.op["x-kvgate-order"] ?? 1e9) - (b.op["x-kvgate-order"] ?? 1e9));

for (const { path, method, op } of ops) {
  for (const ex of op["x-kvgate-examples"] ?? []) {
    const what = `${method} ${path} [${ex.name}]`;
    let url = path.replace(/\{([^}]+)\}/g, (_, p) => {
      if (!ex.params || !(p in ex.params)) throw new Error(`${what}: example lacks path parameter ${p}`);
      return encodeURIComponent(ex.params[p]);
    });
    if (ex.query) url += "?" + new URLSearchParams(ex.query).toString();
    const init = { method, headers: {} };
    if (ex.body !== undefined || ex.rawBody !== undefined) {
      init.body = ex.rawBody ?? JSON.stringify(ex.body);
      init.headers["Content-Type"] = "application/json";
      if (ex.body !== undefined) {
        const reqSchema = op.requestBody?.content?.["application/json"]?.schema;
        if (!reqSchema) { fail(what, "a body is sent but the operation documents no JSON request body"); continue; }
        // A request meant to be refused may break the schema; one meant to
        // succeed must satisfy it.
        if (ex.status < 400) {
          const v = validatorFor(reqSchema);
          if (!v(ex.body)) { fail(what, "example body breaks the request schema: " + ajv.errorsText(v.errors)); continue; }
        }
      }
    }
    let resp, text;
    try {
      resp = await fetch(base + url, init);
      text = await resp.text();
    } catch (e) {
      fail(what, `request failed: ${e}`);
      continue;
    }
    if (resp.status !== ex.status) { fail(what, `status ${resp.status}, documented ${ex.status}: ${text.slice(0, 300)}`); continue; }
    const spec = op.responses[String(resp.status)] ?? op.responses.default;
    if (!spec) { fail(what, `status ${resp.status} is not documented`); continue; }
    const ctype = (resp.headers.get("content-type") ?? "").split(";")[0].trim();
    const media = spec.content?.[ctype];
    if (spec.content && !media) { fail(what, `content type ${ctype} not documented (${Object.keys(spec.content)})`); continue; }
    if (ctype === "application/json" && media?.schema) {
      let body;
      try { body = JSON.parse(text); } catch (e) { fail(what, `body is not JSON: ${text.slice(0, 200)}`); continue; }
      const v = validatorFor(media.schema);
      if (!v(body)) { fail(what, "response breaks the schema: " + ajv.errorsText(v.errors) + " in " + text.slice(0, 300)); continue; }
      if (path.endsWith("/openapi.json") && Object.keys(body.paths ?? {}).length !== Object.keys(api.paths).length) {
        fail(what, "the served document's paths differ from docs/openapi.yaml"); continue;
      }
    }
    passed++;
    console.log(`ok   ${what} -> ${resp.status} ${ctype}`);
  }
}
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
