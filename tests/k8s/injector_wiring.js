#!/usr/bin/env node
// Runs the real `fencegate injector` the way the chart's Deployment runs it (its args, its
// FENCEGATE_INJECT_* environment, the certificate of its generated Secret), on 127.0.0.1, and
// talks to it as the API server would: TLS verified against the webhook's caBundle for the
// Service's DNS name, GET /healthz (the probes' path), POST /mutate with a pod annotated for
// injection. The sidecar it patches in must carry the chart's sidecar settings.
//
// usage: node injector_wiring.js FENCEGATE_BIN RENDERED_FILE RELEASE WORK_DIR
'use strict';

const fs = require('fs');
const https = require('https');
const net = require('net');
const path = require('path');
const { spawn } = require('child_process');
const YAML = require('yaml');
const { readDocs } = require('./validate.js');

const LIMIT_MS = 60000;

function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer().listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
    s.on('error', reject);
  });
}

function request(opts, body) {
  return new Promise((resolve, reject) => {
    const req = https.request({ ...opts, timeout: 3000 }, (res) => {
      let data = '';
      res.on('data', (d) => (data += d));
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body: data }));
    });
    req.on('timeout', () => req.destroy(new Error('timed out')));
    req.on('error', reject);
    if (body) req.write(body);
    req.end();
  });
}

function review(uid, annotations) {
  return JSON.stringify({
    apiVersion: 'admission.k8s.io/v1',
    kind: 'AdmissionReview',
    request: {
      uid,
      kind: { group: '', version: 'v1', kind: 'Pod' },
      resource: { group: '', version: 'v1', resource: 'pods' },
      namespace: 'payments',
      operation: 'CREATE',
      object: {
        apiVersion: 'v1',
        kind: 'Pod',
        metadata: { name: 'worker', namespace: 'payments', annotations },
        spec: { containers: [{ name: 'app', image: 'example/app:1' }] },
      },
    },
  });
}

// The sidecar container a JSONPatch adds, wherever the patch puts it.
function findSidecar(ops) {
  for (const op of ops) {
    const vals = Array.isArray(op.value) ? op.value : [op.value];
    for (const v of vals) if (v && v.name === 'fencegate' && v.image) return { op, c: v };
  }
  return null;
}

async function main(argv) {
  if (argv.length !== 4) {
    console.error('usage: node injector_wiring.js FENCEGATE_BIN RENDERED_FILE RELEASE WORK_DIR');
    return 2;
  }
  const [bin, rendered, release, work] = argv;
  const docs = readDocs(rendered);
  const secret = docs.find((d) => d.kind === 'Secret');
  const dep = docs.find((d) => d.kind === 'Deployment');
  const svc = docs.find((d) => d.kind === 'Service');
  const mwc = docs.find((d) => d.kind === 'MutatingWebhookConfiguration');
  const cmap = docs.find((d) => d.kind === 'ConfigMap');
  if (!secret || !dep || !svc || !mwc || !cmap) {
    console.log('  FAIL injector wiring: the rendering needs a generated Secret, a Deployment, a Service, the webhook and the sidecar ConfigMap');
    return 1;
  }
  const cfgDoc = YAML.parse(cmap.data['config.yaml']);
  const failures = [];
  const check = (cond, what) => cond || failures.push(what);
  const ctr = dep.spec.template.spec.containers[0];
  const env = Object.fromEntries(ctr.env.map((e) => [e.name, e.value]));
  const crt = path.join(work, 'tls.crt');
  const key = path.join(work, 'tls.key');
  fs.writeFileSync(crt, Buffer.from(secret.data['tls.crt'], 'base64'));
  fs.writeFileSync(key, Buffer.from(secret.data['tls.key'], 'base64'), { mode: 0o600 });
  const ca = Buffer.from(mwc.webhooks[0].clientConfig.caBundle, 'base64');
  const port = await freePort();
  // The Deployment's args with the mounted paths and the listen address swapped for this run.
  const args = ctr.args.map((a, i) => {
    if (ctr.args[i - 1] === '--listen') return `127.0.0.1:${port}`;
    if (a === '/tls/tls.crt') return crt;
    if (a === '/tls/tls.key') return key;
    return a;
  });
  const child = spawn(bin, args, { env: { PATH: process.env.PATH, ...env }, stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  child.stderr.on('data', (d) => (stderr += d));
  let exited = null;
  child.on('exit', (code, sig) => (exited = { code, sig }));
  const host = `${svc.metadata.name}.${svc.metadata.namespace}.svc`;
  const base = { host: '127.0.0.1', port, ca, servername: host, headers: { host } };
  try {
    let health = null;
    for (let i = 0; i < 100 && !exited && !health; i++) {
      try {
        health = await request({ ...base, method: 'GET', path: ctr.readinessProbe.httpGet.path });
      } catch (e) {
        if (/certificate|altname|self.signed|verify/i.test(e.message)) throw new Error(`TLS: ${e.message}`);
        await new Promise((r) => setTimeout(r, 100));
      }
    }
    if (!health) throw new Error(`the injector did not answer (${exited ? `exited ${exited.code}` : 'no answer'}): ${stderr.trim()}`);
    check(health.status === 200, `GET ${ctr.readinessProbe.httpGet.path} over TLS for ${host}: ${health.status}`);

    const post = (body) => request({ ...base, method: 'POST', path: mwc.webhooks[0].clientConfig.service.path, headers: { host, 'content-type': 'application/json' } }, body);
    const cm = `${release}-sidecar-config`;
    const appHealth = 'http://127.0.0.1:8080/healthz';
    for (const [uid, annotations] of [['with-config', { 'fencegate.io/inject': 'true', 'fencegate.io/config': cm, 'fencegate.io/app-health-url': appHealth }], ['without-config', { 'fencegate.io/inject': 'true' }]]) {
      const res = await post(review(uid, annotations));
      check(res.status === 200, `POST /mutate (${uid}): ${res.status} ${res.body.slice(0, 200)}`);
      const out = JSON.parse(res.body);
      check(out.response && out.response.uid === uid && out.response.allowed === true, `/mutate (${uid}) allows the pod`);
      const ops = out.response && out.response.patch ? JSON.parse(Buffer.from(out.response.patch, 'base64').toString()) : [];
      const found = findSidecar(ops);
      if (!check(found, `/mutate (${uid}) adds the fencegate sidecar`)) continue;
      const { c } = found;
      check(c.image === env.FENCEGATE_INJECT_IMAGE, `sidecar image ${c.image} is FENCEGATE_INJECT_IMAGE ${env.FENCEGATE_INJECT_IMAGE}`);
      check(c.restartPolicy === 'Always' && /initContainers/.test(found.op.path), 'the sidecar is a native sidecar (an init container with restartPolicy Always)');
      const r = c.resources || {};
      check((r.requests || {}).cpu === env.FENCEGATE_INJECT_CPU_REQUEST && (r.requests || {}).memory === env.FENCEGATE_INJECT_MEMORY_REQUEST, `sidecar requests ${JSON.stringify(r.requests)}`);
      check((r.limits || {}).cpu === env.FENCEGATE_INJECT_CPU_LIMIT && (r.limits || {}).memory === env.FENCEGATE_INJECT_MEMORY_LIMIT, `sidecar limits ${JSON.stringify(r.limits)}`);
      const senv = Object.fromEntries((c.env || []).map((e) => [e.name, e.value]));
      check(senv.FENCEGATE_LISTEN_HTTP === '0.0.0.0:8380', 'the sidecar serves HTTP on the pod IP, where the kubelet probes it');
      if (uid === 'with-config') {
        check(JSON.stringify(ops).includes(`"${cm}"`), `the patch mounts ConfigMap ${cm}`);
        check((c.args || []).join(' ').includes('config.yaml'), `the sidecar reads config.yaml (${(c.args || []).join(' ')})`);
        check(senv.FENCEGATE_APP_HEALTH_URL === appHealth, `fencegate.io/app-health-url gives the sidecar FENCEGATE_APP_HEALTH_URL (${senv.FENCEGATE_APP_HEALTH_URL})`);
      } else {
        check(!('FENCEGATE_APP_HEALTH_URL' in senv), 'no FENCEGATE_APP_HEALTH_URL without fencegate.io/app-health-url');
        check(senv.FENCEGATE_UPSTREAM === env.FENCEGATE_INJECT_UPSTREAM, `sidecar FENCEGATE_UPSTREAM ${senv.FENCEGATE_UPSTREAM}`);
        check(senv.FENCEGATE_BACKEND === env.FENCEGATE_INJECT_BACKEND, `sidecar FENCEGATE_BACKEND ${senv.FENCEGATE_BACKEND}`);
        check(senv.FENCEGATE_SHUTDOWN_GRACE_MS === env.FENCEGATE_INJECT_GRACE_MS, `sidecar FENCEGATE_SHUTDOWN_GRACE_MS ${senv.FENCEGATE_SHUTDOWN_GRACE_MS}`);
        // The same lock keys, lease and log level as the chart's ConfigMap gives.
        check(senv.FENCEGATE_BACKEND_PREFIX === cfgDoc.backend.prefix, `sidecar FENCEGATE_BACKEND_PREFIX ${senv.FENCEGATE_BACKEND_PREFIX}, ConfigMap backend.prefix ${cfgDoc.backend.prefix}`);
        check(senv.FENCEGATE_SESSION_TTL_MS === String(cfgDoc.backend.session_ttl_ms), `sidecar FENCEGATE_SESSION_TTL_MS ${senv.FENCEGATE_SESSION_TTL_MS}, ConfigMap backend.session_ttl_ms ${cfgDoc.backend.session_ttl_ms}`);
        check(senv.FENCEGATE_LOG_LEVEL === cfgDoc.log.level, `sidecar FENCEGATE_LOG_LEVEL ${senv.FENCEGATE_LOG_LEVEL}, ConfigMap log.level ${cfgDoc.log.level}`);
      }
    }

    // After SIGTERM the injector keeps answering for the Deployment's --shutdown-delay, each
    // reply closing its connection; a second SIGTERM ends it.
    const delay = Number(ctr.args[ctr.args.indexOf('--shutdown-delay') + 1] || 0);
    if (delay > 0 && !exited) {
      child.kill('SIGTERM');
      await new Promise((r) => setTimeout(r, 300));
      check(!exited, `the injector still runs 0.3 s after SIGTERM (--shutdown-delay ${delay})`);
      const late = await request({ ...base, method: 'GET', path: ctr.readinessProbe.httpGet.path });
      check(late.status === 200 && late.headers.connection === 'close', `GET after SIGTERM: ${late.status}, Connection: ${late.headers.connection}`);
      check(stderr.includes(`answering for ${delay} more seconds`), `the injector logs its shutdown delay of ${delay} s`);
    }
  } catch (e) {
    failures.push(e.message);
  } finally {
    if (!exited) {
      child.kill('SIGTERM'); // the first, or the second that ends a shutdown delay
      for (let i = 0; i < 50 && !exited; i++) await new Promise((r) => setTimeout(r, 100));
      if (!exited) child.kill('SIGKILL');
    }
  }
  check(!exited || exited.code === 0 || exited.sig === 'SIGTERM', `the injector exits cleanly on SIGTERM (${JSON.stringify(exited)})`);
  if (failures.length) {
    for (const f of failures) console.log(`  FAIL injector wiring: ${f}`);
    return 1;
  }
  console.log(`injector wiring: the chart's args, environment and certificate run fencegate injector; TLS verified for ${host}; /mutate adds the configured sidecar`);
  return 0;
}

if (require.main === module) {
  setTimeout(() => {
    console.log(`  FAIL injector wiring: no result after ${LIMIT_MS / 1000} s`);
    process.exit(1);
  }, LIMIT_MS).unref();
  main(process.argv.slice(2)).then((code) => process.exit(code), (e) => {
    console.log(`  FAIL injector wiring: ${e.message}`);
    process.exit(1);
  });
}
