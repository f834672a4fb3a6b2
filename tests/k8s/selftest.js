#!/usr/bin/env node
// The checks must be able to fail: feeds validate.js objects with a wrong type, a wrong enum
// value and misplaced or misspelt fields, taken from a real rendering, and expects each to be
// reported. A validator that accepts them would let the chart's checks pass for nothing.
//
// usage: node selftest.js RENDERED_FILE    (a rendering with a generated Secret, e.g. defaults)
'use strict';

const { validateObject, readDocs } = require('./validate.js');

function main(argv) {
  if (argv.length !== 1) {
    console.error('usage: node selftest.js RENDERED_FILE');
    return 2;
  }
  const docs = readDocs(argv[0]);
  const get = (kind) => JSON.parse(JSON.stringify(docs.find((d) => d.kind === kind)));
  const cases = [
    ['Deployment', 'a misspelt probe', (d) => { d.spec.template.spec.containers[0].readinessprobe = {}; }, /readinessprobe: unknown field/],
    ['Deployment', 'a field one level too deep', (d) => { d.spec.template.spec.containers[0].securityContext.fsGroup = 1; }, /securityContext\.fsGroup: unknown field/],
    ['Deployment', 'a wrong type', (d) => { d.spec.replicas = 'two'; }, /replicas: must be integer/],
    ['Deployment', 'an unknown field in a list item', (d) => { d.spec.template.spec.containers[0].env[0].valueFromm = {}; }, /env\[0\]\.valueFromm: unknown field/],
    ['MutatingWebhookConfiguration', 'a bad enum value', (d) => { d.webhooks[0].failurePolicy = 'Sometimes'; }, /failurePolicy: must be equal to one of the allowed values/],
    ['MutatingWebhookConfiguration', 'sideEffect for sideEffects', (d) => { d.webhooks[0].sideEffect = 'None'; }, /sideEffect: unknown field/],
    ['Service', 'a port as text', (d) => { d.spec.ports[0].port = 'https'; }, /port: must be integer/],
    ['Secret', 'a field under metadata', (d) => { d.metadata.label = {}; }, /metadata\.label: unknown field/],
    ['ConfigMap', 'data that is not text', (d) => { d.data['config.yaml'] = { listen: {} }; }, /must be string/],
  ];
  let bad = 0;
  for (const [kind, what, mutate, want] of cases) {
    const obj = get(kind);
    mutate(obj);
    const problems = validateObject(obj);
    if (!problems.some((p) => want.test(p))) {
      bad++;
      console.log(`  FAIL selftest: ${kind} with ${what} was not reported as ${want} (got: ${problems.join('; ') || 'valid'})`);
    }
  }
  const unknownKind = validateObject({ apiVersion: 'example.com/v1', kind: 'Widget', metadata: { name: 'w' } });
  if (!unknownKind.length) {
    bad++;
    console.log('  FAIL selftest: a kind without a schema was accepted');
  }
  console.log(`selftest: ${cases.length + 1 - bad} of ${cases.length + 1} broken objects reported`);
  return bad ? 1 : 0;
}

if (require.main === module) process.exit(main(process.argv.slice(2)));
