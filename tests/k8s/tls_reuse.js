#!/usr/bin/env node
// Checks that the chart keeps its generated webhook certificate on upgrade, offline: Helm's
// `lookup` only reads a live cluster, so this serves the few API paths `helm template
// --dry-run=server` reads from a stand-in API server on 127.0.0.1, first with no Secret (an
// install: new CA and certificate), then with the Secret of that render (an upgrade: the same
// certificate, key and caBundle must come back), then with a Secret that lacks ca.crt (not
// reusable: a new CA and certificate).
//
// usage: node tls_reuse.js HELM CHART_DIR RELEASE NAMESPACE WORK_DIR
// Exits 1 listing what failed, 2 on a usage error. Everything it starts stops before it exits.
'use strict';

const fs = require('fs');
const http = require('http');
const path = require('path');
const { execFile } = require('child_process');
const YAML = require('yaml');

const LIMIT_MS = 150000;

// The API groups and resources the chart renders: enough discovery for Helm to map its objects.
const GROUPS = {
  'apps/v1': [['deployments', 'Deployment', true]],
  'policy/v1': [['poddisruptionbudgets', 'PodDisruptionBudget', true]],
  'admissionregistration.k8s.io/v1': [['mutatingwebhookconfigurations', 'MutatingWebhookConfiguration', false]],
};
const CORE = [['secrets', 'Secret', true], ['configmaps', 'ConfigMap', true], ['services', 'Service', true],
  ['serviceaccounts', 'ServiceAccount', true], ['namespaces', 'Namespace', false]];

function resourceList(gv, resources) {
  return {
    kind: 'APIResourceList', apiVersion: 'v1', groupVersion: gv,
    resources: resources.map(([name, kind, namespaced]) => ({ name, singularName: kind.toLowerCase(), namespaced, kind, verbs: ['get', 'list', 'create', 'update', 'patch', 'delete'] })),
  };
}

// A stand-in API server: discovery, one Secret (state.secret, or none), 404 for anything else.
function startApi(state) {
  const server = http.createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      const url = req.url.split('?')[0];
      const send = (code, obj) => {
        res.writeHead(code, { 'Content-Type': 'application/json' });
        res.end(JSON.stringify(obj));
      };
      if (url === '/version') return send(200, { major: '1', minor: '33', gitVersion: 'v1.33.0', platform: 'linux/amd64' });
      if (url === '/api') return send(200, { kind: 'APIVersions', versions: ['v1'], serverAddressByClientCIDRs: [] });
      if (url === '/apis') {
        return send(200, {
          kind: 'APIGroupList', apiVersion: 'v1',
          groups: Object.keys(GROUPS).map((gv) => {
            const [name, version] = gv.split('/');
            return { name, versions: [{ groupVersion: gv, version }], preferredVersion: { groupVersion: gv, version } };
          }),
        });
      }
      if (url === '/api/v1') return send(200, resourceList('v1', CORE));
      const group = url.match(/^\/apis\/([^/]+\/[^/]+)$/);
      if (group && GROUPS[group[1]]) return send(200, resourceList(group[1], GROUPS[group[1]]));
      const secret = url.match(/^\/api\/v1\/namespaces\/([^/]+)\/secrets\/([^/]+)$/);
      if (req.method === 'GET' && secret && state.secret && state.secret.metadata.namespace === secret[1] && state.secret.metadata.name === secret[2]) {
        return send(200, state.secret);
      }
      if (req.method === 'GET' && /^\/api\/v1\/namespaces\/[^/]+\/secrets$/.test(url)) return send(200, { kind: 'SecretList', apiVersion: 'v1', metadata: {}, items: [] });
      send(404, { kind: 'Status', apiVersion: 'v1', status: 'Failure', reason: 'NotFound', code: 404, message: 'not found' });
    });
  });
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve(server)));
}

function helmTemplate(helm, chart, release, ns, env) {
  return new Promise((resolve, reject) => {
    execFile(helm, ['template', release, chart, '-n', ns, '--dry-run=server', '--disable-openapi-validation'],
      { env, timeout: 60000, maxBuffer: 16 << 20 }, (err, stdout, stderr) => {
        if (err) reject(new Error(`helm template --dry-run=server failed: ${stderr || err.message}`));
        else resolve(stdout);
      });
  });
}

function pick(manifest) {
  const docs = YAML.parseAllDocuments(manifest).map((d) => d.toJS()).filter(Boolean);
  const secret = docs.find((d) => d.kind === 'Secret');
  const mwc = docs.find((d) => d.kind === 'MutatingWebhookConfiguration');
  const dep = docs.find((d) => d.kind === 'Deployment');
  return {
    secret,
    data: (secret && secret.data) || {},
    caBundle: mwc && mwc.webhooks[0].clientConfig.caBundle,
    checksum: dep && (dep.spec.template.metadata.annotations || {})['checksum/tls'],
  };
}

async function main(argv) {
  if (argv.length !== 5) {
    console.error('usage: node tls_reuse.js HELM CHART_DIR RELEASE NAMESPACE WORK_DIR');
    return 2;
  }
  const [helm, chart, release, ns, work] = argv;
  const failures = [];
  const check = (cond, what) => {
    if (!cond) failures.push(what);
  };
  const state = { secret: null };
  const server = await startApi(state);
  try {
    const kubeconfig = path.join(work, 'kubeconfig');
    fs.writeFileSync(kubeconfig, YAML.stringify({
      apiVersion: 'v1', kind: 'Config', 'current-context': 'standin',
      clusters: [{ name: 'standin', cluster: { server: `http://127.0.0.1:${server.address().port}` } }],
      users: [{ name: 'standin', user: {} }],
      contexts: [{ name: 'standin', context: { cluster: 'standin', user: 'standin', namespace: ns } }],
    }));
    const env = { ...process.env, KUBECONFIG: kubeconfig };

    // Install: no Secret yet.
    const first = pick(await helmTemplate(helm, chart, release, ns, env));
    const secretName = first.secret && first.secret.metadata.name;
    check(first.secret, 'install renders the TLS Secret');
    check(first.data['tls.crt'] && first.data['tls.key'] && first.data['ca.crt'], 'install generates tls.crt, tls.key and ca.crt');
    check(first.caBundle === first.data['ca.crt'], 'install: caBundle is the new CA');

    // Upgrade: the Secret of the install exists.
    state.secret = {
      apiVersion: 'v1', kind: 'Secret', type: 'kubernetes.io/tls', data: first.data,
      metadata: {
        name: secretName, namespace: ns, labels: { 'app.kubernetes.io/managed-by': 'Helm' },
        annotations: { 'meta.helm.sh/release-name': release, 'meta.helm.sh/release-namespace': ns },
      },
    };
    const second = pick(await helmTemplate(helm, chart, release, ns, env));
    for (const k of ['tls.crt', 'tls.key', 'ca.crt']) check(second.data[k] === first.data[k], `upgrade keeps ${k}`);
    check(second.caBundle === first.data['ca.crt'], 'upgrade keeps the caBundle');
    check(second.checksum === first.checksum, 'upgrade does not roll the injector pods');

    // A Secret without ca.crt cannot back the caBundle: new material.
    state.secret = { ...state.secret, data: { 'tls.crt': first.data['tls.crt'], 'tls.key': first.data['tls.key'] } };
    const third = pick(await helmTemplate(helm, chart, release, ns, env));
    check(third.data['ca.crt'] && third.data['ca.crt'] !== first.data['ca.crt'], 'an incomplete Secret is replaced by a new CA');
    check(third.caBundle === third.data['ca.crt'], 'and the caBundle follows it');
  } finally {
    server.close();
  }
  if (failures.length) {
    for (const f of failures) console.log(`  FAIL tls reuse: ${f}`);
    return 1;
  }
  console.log('tls reuse: install generates, upgrade keeps certificate, key and caBundle, an incomplete Secret is replaced');
  return 0;
}

if (require.main === module) {
  setTimeout(() => {
    console.log(`  FAIL tls reuse: no result after ${LIMIT_MS / 1000} s`);
    process.exit(1);
  }, LIMIT_MS).unref();
  main(process.argv.slice(2)).then((code) => process.exit(code), (e) => {
    console.log(`  FAIL tls reuse: ${e.message}`);
    process.exit(1);
  });
}
