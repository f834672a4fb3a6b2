#!/usr/bin/env node
// Every key of the chart's values.yaml is documented in its README.md, as `key.path`
// (objects that are Kubernetes fields passed through, like resources, count as one key).
//
// usage: node values_documented.js CHART_DIR
'use strict';

const fs = require('fs');
const path = require('path');
const YAML = require('yaml');

const PASSED_THROUGH = new Set(['resources', 'podSecurityContext', 'securityContext', 'matchLabels']);

function main(argv) {
  if (argv.length !== 1) {
    console.error('usage: node values_documented.js CHART_DIR');
    return 2;
  }
  const values = YAML.parse(fs.readFileSync(path.join(argv[0], 'values.yaml'), 'utf8'));
  const readme = fs.readFileSync(path.join(argv[0], 'README.md'), 'utf8');
  const keys = [];
  (function walk(obj, prefix) {
    for (const [k, v] of Object.entries(obj)) {
      const key = prefix ? `${prefix}.${k}` : k;
      if (v && typeof v === 'object' && !Array.isArray(v) && Object.keys(v).length && !PASSED_THROUGH.has(k)) walk(v, key);
      else keys.push(key);
    }
  })(values, '');
  const missing = keys.filter((k) => !readme.includes(`\`${k}\``));
  for (const k of missing) console.log(`  FAIL docs: values key ${k} is not documented in README.md`);
  if (!missing.length) console.log(`docs: all ${keys.length} values keys are documented in the chart README`);
  return missing.length ? 1 : 0;
}

if (require.main === module) process.exit(main(process.argv.slice(2)));
