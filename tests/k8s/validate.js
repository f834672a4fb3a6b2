#!/usr/bin/env node
// Validates Kubernetes manifests offline: each object against the schema of its kind from the
// npm package kubernetes-models (or @kubernetes-models/cert-manager), and, because those schemas
// accept any extra field, against the field lists of the same package's type declarations, so
// a misspelt or misplaced field (`readinessprobe`, `securityContext` one level too high) fails.
//
// usage: node validate.js FILE...    (multi-document YAML, e.g. the output of `helm template`)
// Prints one line per object; exits 1 after listing every problem, 2 on a usage error.
// Needs NODE_PATH to hold the node_modules of tests/k8s/package.json.
'use strict';

const fs = require('fs');
const path = require('path');
const YAML = require('yaml');

// Where the models of an apiVersion live: the core group, the other built-in groups, and the
// CRDs this project renders.
function modelModule(apiVersion) {
  if (apiVersion.startsWith('cert-manager.io/')) return `@kubernetes-models/cert-manager/${apiVersion}`;
  return `kubernetes-models/${apiVersion}`;
}

// ---- A reader for the subset of TypeScript the declaration files use ----------------------
// Types: string | number | boolean | any | object | "literal" | A | B | Array<T> | T[] |
// { "field"?: T; ... } | { [key: string]: T; } | ImportedName.

function tokenize(src) {
  src = src.replace(/\/\*[\s\S]*?\*\//g, ' ').replace(/\/\/[^\n]*/g, ' ');
  const toks = [];
  const re = /\s*("(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|[A-Za-z_$][\w$]*|-?\d+(?:\.\d+)?|[{}<>[\]():;?|,=&.])/y;
  let m;
  while (re.lastIndex < src.length) {
    const at = re.lastIndex;
    if (!(m = re.exec(src))) {
      if (/^\s*$/.test(src.slice(at))) break;
      throw new Error(`cannot read type declarations near: ${src.slice(at, at + 40)}`);
    }
    toks.push(m[1]);
  }
  return toks;
}

class TypeParser {
  constructor(toks, pos) {
    this.t = toks;
    this.i = pos;
  }
  peek(k = 0) { return this.t[this.i + k]; }
  next() { return this.t[this.i++]; }
  expect(tok) {
    const got = this.next();
    if (got !== tok) throw new Error(`expected '${tok}' in type declarations, got '${got}'`);
  }
  type() {
    if (this.peek() === '|') this.next();
    const members = [this.postfix()];
    while (this.peek() === '|') {
      this.next();
      members.push(this.postfix());
    }
    if (members.length === 1) return members[0];
    const shaped = members.filter((m) => m.kind !== 'scalar');
    return shaped.length === 1 ? shaped[0] : shaped.length ? { kind: 'any' } : { kind: 'scalar' };
  }
  postfix() {
    let t = this.primary();
    while (this.peek() === '[' && this.peek(1) === ']') {
      this.next();
      this.next();
      t = { kind: 'array', of: t };
    }
    return t;
  }
  primary() {
    const tok = this.next();
    if (tok === '{') return this.objectLiteral();
    if (tok === '(') {
      const t = this.type();
      this.expect(')');
      return t;
    }
    if (/^["'\d-]/.test(tok)) return { kind: 'scalar' };
    if (tok === 'Array' && this.peek() === '<') {
      this.next();
      const of = this.type();
      this.expect('>');
      return { kind: 'array', of };
    }
    if (['string', 'number', 'boolean', 'null', 'undefined', 'true', 'false'].includes(tok)) return { kind: 'scalar' };
    if (['any', 'object', 'unknown'].includes(tok)) return { kind: 'any' };
    if (/^[A-Za-z_$]/.test(tok)) {
      if (this.peek() === '<') throw new Error(`generic type ${tok}<...> in type declarations`);
      return { kind: 'ref', name: tok };
    }
    throw new Error(`unexpected '${tok}' in type declarations`);
  }
  // After '{': fields, or one index signature (a map).
  objectLiteral() {
    const fields = Object.create(null);
    let map = null;
    while (this.peek() !== '}') {
      if (this.peek() === '[') {
        this.next();
        this.next(); // key
        this.expect(':');
        this.next(); // string
        this.expect(']');
        this.expect(':');
        map = this.type();
      } else {
        let name = this.next();
        if (/^["']/.test(name)) name = JSON.parse(name.replace(/^'|'$/g, '"'));
        if (this.peek() === '?') this.next();
        this.expect(':');
        fields[name] = this.type();
      }
      if (this.peek() === ';' || this.peek() === ',') this.next();
    }
    this.expect('}');
    return map ? { kind: 'map', of: map } : { kind: 'object', fields };
  }
}

// One declaration file: its imports, its exported aliases and its declarations.
const files = new Map();
function loadDecls(file) {
  if (files.has(file)) return files.get(file);
  const src = fs.readFileSync(file, 'utf8');
  const info = { file, imports: Object.create(null), decls: Object.create(null), aliases: Object.create(null) };
  files.set(file, info);
  for (const m of src.matchAll(/^import\s*\{([^}]*)\}\s*from\s*"([^"]+)";/gm)) {
    for (const name of m[1].split(',').map((s) => s.trim()).filter(Boolean)) {
      const [orig, local] = name.split(/\s+as\s+/);
      info.imports[(local || orig).trim()] = { spec: m[2], name: orig.trim() };
    }
  }
  for (const m of src.matchAll(/^export\s*\{([^}]*)\};?/gm)) {
    for (const name of m[1].split(',').map((s) => s.trim()).filter(Boolean)) {
      const [orig, as] = name.split(/\s+as\s+/);
      if (as) info.aliases[as.trim()] = orig.trim();
    }
  }
  const toks = tokenize(src.replace(/^import[^\n]*$/gm, '').replace(/^export\s*\{[^}]*\};?/gm, ''));
  for (let i = 0; i < toks.length; i++) {
    if (toks[i] === 'interface') {
      // interface Name [extends TypeMeta, ...] { ... }: the fields of TypeMeta are redeclared.
      let j = i + 2;
      while (j < toks.length && toks[j] !== '{') j++;
      const p = new TypeParser(toks, j + 1);
      info.decls[toks[i + 1]] = p.objectLiteral();
      i = p.i - 1;
    } else if (toks[i] === 'type' && toks[i + 2] === '=' && /^[A-Za-z_$]/.test(toks[i + 1])) {
      const p = new TypeParser(toks, i + 3);
      info.decls[toks[i + 1]] = p.type();
      i = p.i - 1;
    }
  }
  return info;
}

function resolveSpec(spec, fromFile) {
  if (spec.startsWith('.')) return path.resolve(path.dirname(fromFile), spec) + '.d.ts';
  for (let dir = path.dirname(fromFile); ; dir = path.dirname(dir)) {
    const f = path.join(dir, 'node_modules', spec + '.d.ts');
    if (fs.existsSync(f)) return f;
    if (dir === path.dirname(dir)) break;
  }
  for (const root of (process.env.NODE_PATH || '').split(path.delimiter).filter(Boolean)) {
    const f = path.join(root, spec + '.d.ts');
    if (fs.existsSync(f)) return f;
  }
  return null;
}

// The shape a named type stands for, followed through imports and aliases; 'any' when the name
// leads nowhere (then nothing below it is checked).
function resolveRef(name, info, depth = 0) {
  if (depth > 20) return { kind: 'any' };
  if (info.decls[name]) return info.decls[name];
  if (info.aliases[name]) return resolveRef(info.aliases[name], info, depth + 1);
  const imp = info.imports[name];
  if (imp) {
    const f = resolveSpec(imp.spec, info.file);
    if (f) return resolveRef(imp.name, loadDecls(f), depth + 1);
  }
  return { kind: 'any' };
}

// Every field of value that its declared shape does not have, as JSON paths.
function unknownFields(value, shape, info, at, out) {
  while (shape.kind === 'ref') {
    const named = shape;
    shape = resolveRef(named.name, info);
    if (shape.kind === 'ref' && shape.name === named.name) return;
    // The named type's own file resolves the names inside it.
    const owner = ownerOf(named.name, info);
    if (owner) info = owner;
  }
  if (value === null || typeof value !== 'object') return;
  if (shape.kind === 'array' && Array.isArray(value)) {
    value.forEach((v, i) => unknownFields(v, shape.of, info, `${at}[${i}]`, out));
  } else if (shape.kind === 'map' && !Array.isArray(value)) {
    for (const [k, v] of Object.entries(value)) unknownFields(v, shape.of, info, `${at}.${k}`, out);
  } else if (shape.kind === 'object' && !Array.isArray(value)) {
    for (const [k, v] of Object.entries(value)) {
      if (!(k in shape.fields)) out.push(`${at}.${k}: unknown field`);
      else unknownFields(v, shape.fields[k], info, `${at}.${k}`, out);
    }
  }
}

// The declaration file that defines name, as seen from info (for resolving names inside it).
function ownerOf(name, info, depth = 0) {
  if (depth > 20) return null;
  if (info.decls[name]) return info;
  if (info.aliases[name]) return ownerOf(info.aliases[name], info, depth + 1);
  const imp = info.imports[name];
  if (!imp) return null;
  const f = resolveSpec(imp.spec, info.file);
  return f ? ownerOf(imp.name, loadDecls(f), depth + 1) : null;
}

// ---- Validation of one object -------------------------------------------------------------

function validateObject(obj) {
  const problems = [];
  const { apiVersion, kind } = obj;
  if (typeof apiVersion !== 'string' || typeof kind !== 'string') return ['no apiVersion or kind'];
  let mod;
  let modFile;
  try {
    modFile = require.resolve(modelModule(apiVersion));
    mod = require(modFile);
  } catch (e) {
    return [`no schema for apiVersion ${apiVersion} (${e.code || e.message})`];
  }
  const Model = mod[kind];
  if (typeof Model !== 'function') return [`no schema for kind ${kind} in ${apiVersion}`];
  try {
    new Model(obj).validate();
  } catch (e) {
    const errs = e.errors || e.details || [];
    if (Array.isArray(errs) && errs.length) {
      for (const d of errs) problems.push(`${d.instancePath || d.dataPath || '/'}: ${d.message}${d.params && d.params.allowedValues ? ` (${d.params.allowedValues.join(', ')})` : ''}`);
    } else {
      problems.push(String(e.message || e));
    }
  }
  const dts = path.join(path.dirname(modFile), `${kind}.d.ts`);
  if (!fs.existsSync(dts)) {
    problems.push(`no type declarations for ${kind} (${dts}); cannot check for unknown fields`);
  } else {
    const info = loadDecls(dts);
    const top = info.decls[`I${kind}`];
    if (!top) problems.push(`no interface I${kind} in ${dts}`);
    else unknownFields(obj, top, info, '', problems);
  }
  return problems;
}

function readDocs(file) {
  const docs = [];
  for (const doc of YAML.parseAllDocuments(fs.readFileSync(file, 'utf8'))) {
    if (doc.errors.length) throw new Error(`${file}: YAML: ${doc.errors[0].message}`);
    const obj = doc.toJS();
    if (obj !== null && obj !== undefined) docs.push(obj);
  }
  return docs;
}

function main(argv) {
  if (argv.length === 0) {
    console.error('usage: node validate.js FILE...');
    return 2;
  }
  let bad = 0;
  let n = 0;
  for (const file of argv) {
    for (const obj of readDocs(file)) {
      n++;
      const name = `${obj.kind}/${(obj.metadata && obj.metadata.name) || '?'}`;
      const problems = validateObject(obj);
      if (problems.length) {
        bad++;
        console.log(`  FAIL ${path.basename(file)}: ${name}`);
        for (const p of problems) console.log(`       ${p}`);
      } else {
        console.log(`  ok   ${path.basename(file)}: ${name}`);
      }
    }
  }
  if (n === 0) {
    console.log('validate: no objects found');
    return 1;
  }
  console.log(`validate: ${n - bad} of ${n} objects valid`);
  return bad ? 1 : 0;
}

module.exports = { validateObject, readDocs };
if (require.main === module) process.exit(main(process.argv.slice(2)));
