#!/usr/bin/env node
// References for the grammar engine's JSON schema front end
// (tests/unit/engine/grammar/json_schema_reference_test.cc), from packages nobody here
// wrote: Ajv (Ajv2020, draft 2020-12) with ajv-formats, and the JSON Schema Test Suite
// (npm json-schema-test-suite).
//
//   json_schema_reference.js suite --node-modules DIR --out FILE
//     The suite's draft-4 groups whose schemas use only keywords the front end supports
//     with the same meaning in draft 2020-12, each test's data written as json.dumps
//     writes it (", " and ": ") and compactly, object members in the schema's property
//     order (the order the grammar writes them).
//   json_schema_reference.js validate --node-modules DIR --in FILE --out FILE
//     Validates every generated document of FILE ({"entries": [{name, schema,
//     documents}]}) with Ajv2020 and ajv-formats; writes, per entry, the documents that
//     are not valid JSON or not valid by the schema, with Ajv's errors.
"use strict";
const fs = require("fs");
const path = require("path");

function arg(name) {
  const i = process.argv.indexOf(name);
  if (i < 0 || i + 1 >= process.argv.length) {
    console.error(`json_schema_reference.js: missing ${name}`);
    process.exit(2);
  }
  return process.argv[i + 1];
}

const nodeModules = arg("--node-modules");
const load = (name) => require(path.join(nodeModules, name));

const SUPPORTED = new Set([
  "type", "enum", "const", "$ref", "anyOf", "oneOf", "properties", "required", "additionalProperties", "items",
  "prefixItems", "minItems", "maxItems", "minLength", "maxLength", "pattern", "format", "minimum", "maximum",
  "exclusiveMinimum", "exclusiveMaximum", "title", "description", "default", "examples", "$schema", "$comment",
  "definitions", "$defs",
]);
const FORMATS = new Set(["date", "time", "date-time", "email", "uuid", "ipv4"]);

// Whether a schema (and every schema inside it) stays within the supported keywords
// with draft-4 and draft 2020-12 agreeing on their meaning.
function supported(s) {
  if (typeof s === "boolean") return true;
  if (s === null || typeof s !== "object" || Array.isArray(s)) return false;
  for (const [k, v] of Object.entries(s)) {
    if (!SUPPORTED.has(k)) return false;
    if ((k === "exclusiveMinimum" || k === "exclusiveMaximum") && typeof v !== "number") return false;
    if (k === "items" && Array.isArray(v)) return false;
    if (k === "format" && !FORMATS.has(v)) return false;
    if (k === "$ref" && (typeof v !== "string" || !v.startsWith("#") || Object.keys(s).length !== 1)) return false;
  }
  const subs = [];
  for (const k of ["properties", "definitions", "$defs"]) {
    if (s[k] !== undefined) {
      if (typeof s[k] !== "object" || Array.isArray(s[k])) return false;
      subs.push(...Object.values(s[k]));
    }
  }
  for (const k of ["items", "additionalProperties"]) if (s[k] !== undefined) subs.push(s[k]);
  for (const k of ["anyOf", "oneOf", "prefixItems"]) if (Array.isArray(s[k])) subs.push(...s[k]);
  return subs.every(supported);
}

function resolve(root, s, depth = 0) {
  if (depth > 10 || s === null || typeof s !== "object" || typeof s.$ref !== "string") return s;
  let node = root;
  for (const raw of s.$ref.slice(1).split("/").slice(1)) {
    const tok = decodeURIComponent(raw).replace(/~1/g, "/").replace(/~0/g, "~");
    if (node === null || typeof node !== "object" || !(tok in node)) return s;
    node = node[tok];
  }
  return resolve(root, node, depth + 1);
}

// `data` with object members in the order the schema lists its properties.
function canonical(root, schema, data) {
  const s = resolve(root, schema);
  if (Array.isArray(data)) {
    return data.map((x, i) => {
      if (s && typeof s === "object") {
        if (Array.isArray(s.prefixItems) && i < s.prefixItems.length) return canonical(root, s.prefixItems[i], x);
        if (s.items !== undefined && typeof s.items === "object") return canonical(root, s.items, x);
      }
      return x;
    });
  }
  if (data === null || typeof data !== "object") return data;
  const props = s && typeof s === "object" && s.properties ? s.properties : {};
  const out = {};
  for (const k of Object.keys(props)) if (k in data) out[k] = canonical(root, props[k], data[k]);
  const extra = s && typeof s === "object" && typeof s.additionalProperties === "object" ? s.additionalProperties : null;
  for (const k of Object.keys(data)) if (!(k in props)) out[k] = extra ? canonical(root, extra, data[k]) : data[k];
  return out;
}

// JSON text with these separators (JSON.stringify's escapes and numbers).
function dumps(v, item, key) {
  if (Array.isArray(v)) return "[" + v.map((x) => dumps(x, item, key)).join(item) + "]";
  if (v !== null && typeof v === "object") {
    return "{" + Object.keys(v).map((k) => JSON.stringify(k) + key + dumps(v[k], item, key)).join(item) + "}";
  }
  return JSON.stringify(v);
}

function suite() {
  const dir = path.join(nodeModules, "json-schema-test-suite", "tests", "draft4");
  const files = fs.readdirSync(dir).filter((f) => f.endsWith(".json")).map((f) => path.join(dir, f));
  files.push(path.join(dir, "optional", "format.json"));
  const groups = [];
  let skipped = 0;
  for (const file of files.sort()) {
    for (const g of JSON.parse(fs.readFileSync(file, "utf8"))) {
      if (!supported(g.schema)) {
        ++skipped;
        continue;
      }
      groups.push({
        name: `${path.relative(dir, file)}: ${g.description}`,
        schema: g.schema,
        tests: g.tests.map((t) => {
          const data = canonical(g.schema, g.schema, t.data);
          return {
            description: t.description,
            valid: t.valid,
            data_python: dumps(data, ", ", ": "),
            data_compact: dumps(data, ",", ":"),
          };
        }),
      });
    }
  }
  const out = arg("--out");
  fs.mkdirSync(path.dirname(out), { recursive: true });
  fs.writeFileSync(out, JSON.stringify({ groups }, null, 1));
  console.error(`json_schema_reference.js: ${groups.length} suite groups within the supported keywords, ${skipped} skipped`);
}

function validate() {
  const Ajv2020 = load("ajv/dist/2020").default;
  const addFormats = load("ajv-formats").default;
  const input = JSON.parse(fs.readFileSync(arg("--in"), "utf8"));
  const results = [];
  let documents = 0;
  let invalid = 0;
  for (const e of input.entries) {
    if (e.error !== undefined) continue;
    const ajv = new Ajv2020({ strict: false, allErrors: false });
    addFormats(ajv);
    const check = ajv.compile(e.schema);
    const bad = [];
    for (const doc of e.documents) {
      ++documents;
      let value;
      try {
        value = JSON.parse(doc);
      } catch (err) {
        bad.push({ document: doc, errors: `not JSON: ${err.message}` });
        continue;
      }
      if (!check(value)) bad.push({ document: doc, errors: ajv.errorsText(check.errors) });
    }
    invalid += bad.length;
    results.push({ name: e.name, documents: e.documents.length, invalid: bad });
  }
  const out = arg("--out");
  fs.mkdirSync(path.dirname(out), { recursive: true });
  fs.writeFileSync(out, JSON.stringify({ entries: results, documents, invalid }, null, 1));
  console.error(`json_schema_reference.js: ${documents} documents of ${results.length} schemas, ${invalid} invalid`);
}

const mode = process.argv[2];
if (mode === "suite") suite();
else if (mode === "validate") validate();
else {
  console.error("usage: json_schema_reference.js suite|validate ...");
  process.exit(2);
}
