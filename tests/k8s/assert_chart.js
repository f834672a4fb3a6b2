#!/usr/bin/env node
// Asserts what matters in the fencegate chart's rendered manifests, for one values file: the
// webhook's selection and failure policy, the injector's probes, security and sidecar settings,
// the sidecar ConfigMap, and the TLS wiring of each certificate source. Expectations come from
// the chart's values.yaml merged with the values file, as Helm merges them.
//
// usage: node assert_chart.js CHART_DIR VALUES_FILE RENDERED_FILE RELEASE NAMESPACE [CONFIG_OUT]
//   CONFIG_OUT: where to write the sidecar config.yaml of the first ConfigMap (for the caller to
//   feed to the fencegate binary).
// Exits 1 listing every failed assertion, 2 on a usage error.
'use strict';

const crypto = require('crypto');
const fs = require('fs');
const path = require('path');
const YAML = require('yaml');
const { readDocs } = require('./validate.js');

const failures = [];
let checks = 0;
function check(cond, what) {
  checks++;
  if (!cond) failures.push(what);
  return cond;
}
// JSON with object keys sorted, so that equal objects compare equal whatever their key order.
function canon(x) {
  if (Array.isArray(x)) return `[${x.map(canon).join(',')}]`;
  if (x && typeof x === 'object') return `{${Object.keys(x).sort().map((k) => `${JSON.stringify(k)}:${canon(x[k])}`).join(',')}}`;
  return JSON.stringify(x);
}
function eq(got, want, what) {
  const ok = canon(got) === canon(want);
  return check(ok, `${what}: got ${JSON.stringify(got)}, want ${JSON.stringify(want)}`);
}

// Helm's merge: maps merge key by key, null deletes a key, anything else (lists included) is
// replaced.
function merge(base, over) {
  if (over === null || typeof over !== 'object' || Array.isArray(over)) return over;
  const out = { ...base };
  for (const [k, v] of Object.entries(over)) {
    if (v === null) delete out[k];
    else out[k] = base && typeof base[k] === 'object' && !Array.isArray(base[k]) && base[k] !== null ? merge(base[k], v) : v;
  }
  return out;
}

function main(argv) {
  if (argv.length < 5) {
    console.error('usage: node assert_chart.js CHART_DIR VALUES_FILE RENDERED_FILE RELEASE NAMESPACE [CONFIG_OUT]');
    return 2;
  }
  const [chartDir, valuesFile, renderedFile, release, ns, configOut] = argv;
  const chart = YAML.parse(fs.readFileSync(path.join(chartDir, 'Chart.yaml'), 'utf8'));
  const defaults = YAML.parse(fs.readFileSync(path.join(chartDir, 'values.yaml'), 'utf8'));
  const v = merge(defaults, YAML.parse(fs.readFileSync(valuesFile, 'utf8')) || {});
  const docs = readDocs(renderedFile);
  const all = (kind) => docs.filter((d) => d.kind === kind);
  const one = (kind) => {
    const list = all(kind);
    check(list.length === 1, `exactly one ${kind} (found ${list.length})`);
    return list[0] || {};
  };

  const fullname = v.fullnameOverride || (release.includes(chart.name) ? release : `${release}-${chart.name}`);
  const injector = `${fullname}-injector`;
  const mode = v.tls.certManager.enabled ? 'cert-manager' : v.tls.existingSecret ? 'existing' : 'generated';
  const secretName = v.tls.existingSecret || `${injector}-tls`;
  const imageRef = (img, tagDefault) => (img.digest ? `${img.repository}@${img.digest}` : `${img.repository}:${img.tag || tagDefault}`);
  const injectorImage = imageRef(v.image, chart.appVersion);
  const sidecarImage = v.sidecar.image.repository
    ? imageRef(v.sidecar.image, chart.appVersion)
    : imageRef({ repository: v.image.repository, tag: v.sidecar.image.tag || v.image.tag, digest: v.sidecar.image.digest || v.image.digest }, chart.appVersion);
  const backend = v.sidecar.backend.url || v.sidecar.upstream.url;

  // Nothing the injector does needs the Kubernetes API.
  for (const k of ['Role', 'ClusterRole', 'RoleBinding', 'ClusterRoleBinding']) eq(all(k).length, 0, `no ${k} rendered`);
  for (const d of docs) {
    if (d.kind !== 'MutatingWebhookConfiguration') eq(d.metadata.namespace, d.kind === 'ConfigMap' ? d.metadata.namespace : ns, `${d.kind}/${d.metadata.name} namespace`);
  }

  // ---- The webhook ----
  const mwc = one('MutatingWebhookConfiguration');
  const hooks = mwc.webhooks || [];
  eq(hooks.length, 1, 'one webhook');
  const wh = hooks[0] || {};
  check(/^[a-z0-9-]+(\.[a-z0-9-]+){2,}$/.test(wh.name || ''), `webhook name is fully qualified (${wh.name})`);
  eq(wh.admissionReviewVersions, ['v1'], 'admissionReviewVersions');
  eq(wh.sideEffects, 'None', 'sideEffects');
  eq(wh.failurePolicy, v.webhook.failurePolicy, 'failurePolicy');
  eq(wh.timeoutSeconds, v.webhook.timeoutSeconds, 'timeoutSeconds');
  eq(wh.reinvocationPolicy, v.webhook.reinvocationPolicy, 'reinvocationPolicy');
  eq(wh.rules, [{ apiGroups: [''], apiVersions: ['v1'], operations: ['CREATE'], resources: ['pods'], scope: 'Namespaced' }], 'rules: pod CREATE only');
  const svc = one('Service');
  eq(wh.clientConfig && wh.clientConfig.service, { name: svc.metadata.name, namespace: ns, path: '/mutate', port: 443 }, 'clientConfig.service');
  eq(svc.spec.ports, [{ name: 'https', port: 443, targetPort: 'https', protocol: 'TCP' }], 'Service ports');
  const sel = wh.namespaceSelector || {};
  const exclusion = (sel.matchExpressions || []).find((e) => e.key === 'kubernetes.io/metadata.name' && e.operator === 'NotIn');
  if (check(exclusion, 'namespaceSelector excludes namespaces by kubernetes.io/metadata.name NotIn')) {
    for (const n of ['kube-system', ns, ...v.webhook.excludeNamespaces]) check(exclusion.values.includes(n), `namespace ${n} is excluded from the webhook`);
  }
  eq(sel.matchLabels || {}, v.webhook.namespaceSelector.matchLabels || {}, 'namespaceSelector.matchLabels');
  for (const e of v.webhook.namespaceSelector.matchExpressions || []) check((sel.matchExpressions || []).some((x) => canon(x) === canon(e)), `namespaceSelector keeps ${JSON.stringify(e)}`);
  eq(wh.objectSelector || {}, v.webhook.objectSelector || {}, 'objectSelector');

  // ---- The injector ----
  const dep = one('Deployment');
  const pod = (dep.spec && dep.spec.template) || { metadata: {}, spec: {} };
  const ctrs = pod.spec.containers || [];
  eq(ctrs.length, 1, 'one injector container');
  const c = ctrs[0] || {};
  eq(dep.spec.replicas, v.injector.replicas, 'replicas');
  eq(dep.spec.strategy && dep.spec.strategy.rollingUpdate && dep.spec.strategy.rollingUpdate.maxUnavailable, 0, 'rolling update keeps every injector until its replacement is ready');
  eq(c.image, injectorImage, 'injector image');
  eq(c.args, ['injector', '--listen', `0.0.0.0:${v.injector.port}`, '--cert', '/tls/tls.crt', '--key', '/tls/tls.key', '--log-level', v.injector.logLevel, '--shutdown-delay', String(v.injector.shutdownDelaySeconds)], 'injector args');
  eq(pod.spec.terminationGracePeriodSeconds, v.injector.shutdownDelaySeconds + 10, 'terminationGracePeriodSeconds leaves 10 s after the shutdown delay');
  eq(c.ports, [{ name: 'https', containerPort: v.injector.port, protocol: 'TCP' }], 'injector port');
  for (const probe of ['readinessProbe', 'livenessProbe']) {
    const p = c[probe] || {};
    eq(p.httpGet, { path: '/healthz', port: 'https', scheme: 'HTTPS' }, `${probe} is GET /healthz over HTTPS`);
  }
  for (const [k, val] of Object.entries(dep.spec.selector.matchLabels)) eq(pod.metadata.labels[k], val, `pod label ${k} matches the selector`);
  for (const [k, val] of Object.entries(svc.spec.selector)) eq(pod.metadata.labels[k], val, `pod label ${k} matches the Service`);
  const sc = c.securityContext || {};
  const psc = pod.spec.securityContext || {};
  eq(sc.runAsNonRoot === true || psc.runAsNonRoot === true, true, 'runAsNonRoot');
  eq(sc.readOnlyRootFilesystem, true, 'readOnlyRootFilesystem');
  eq(sc.allowPrivilegeEscalation, false, 'allowPrivilegeEscalation');
  check(((sc.capabilities || {}).drop || []).includes('ALL'), 'capabilities drop ALL');
  check(!((sc.capabilities || {}).add || []).length, 'no capabilities added');
  eq((sc.seccompProfile || psc.seccompProfile || {}).type, 'RuntimeDefault', 'seccompProfile RuntimeDefault');
  check(!sc.privileged, 'not privileged');
  eq(pod.spec.automountServiceAccountToken, false, 'no service account token mounted');
  if (v.serviceAccount.create) eq(pod.spec.serviceAccountName, one('ServiceAccount').metadata.name, 'serviceAccountName');
  eq(c.resources, v.injector.resources, 'injector resources');
  const tlsVol = (pod.spec.volumes || []).find((x) => x.name === 'tls') || {};
  eq(tlsVol.secret && tlsVol.secret.secretName, secretName, 'TLS volume secret');
  eq((c.volumeMounts || []).find((m) => m.name === 'tls'), { name: 'tls', mountPath: '/tls', readOnly: true }, 'TLS mounted read-only at /tls');
  const env = Object.fromEntries((c.env || []).map((e) => [e.name, e.value]));
  const res = v.sidecar.resources;
  eq(env, {
    FENCEGATE_INJECT_IMAGE: sidecarImage,
    FENCEGATE_INJECT_CPU_REQUEST: res.requests.cpu || '',
    FENCEGATE_INJECT_MEMORY_REQUEST: res.requests.memory || '',
    FENCEGATE_INJECT_CPU_LIMIT: res.limits.cpu || '',
    FENCEGATE_INJECT_MEMORY_LIMIT: res.limits.memory || '',
    FENCEGATE_INJECT_BACKEND: backend,
    FENCEGATE_INJECT_UPSTREAM: v.sidecar.upstream.url,
    FENCEGATE_INJECT_GRACE_MS: String(v.sidecar.shutdownGraceMs),
    FENCEGATE_INJECT_BACKEND_PREFIX: v.sidecar.backend.prefix,
    FENCEGATE_INJECT_SESSION_TTL_MS: String(v.sidecar.sessionTtlMs),
    FENCEGATE_INJECT_LOG_LEVEL: v.sidecar.logLevel,
  }, 'injector environment (the injected sidecar settings)');
  eq(pod.spec.imagePullSecrets || [], v.imagePullSecrets, 'imagePullSecrets');

  const pdbs = all('PodDisruptionBudget');
  if (v.injector.podDisruptionBudget.enabled && v.injector.replicas > 1) {
    if (eq(pdbs.length, 1, 'a PodDisruptionBudget')) {
      eq(pdbs[0].spec.minAvailable, v.injector.podDisruptionBudget.minAvailable, 'PDB minAvailable');
      check(pdbs[0].spec.minAvailable < v.injector.replicas, 'PDB leaves room to drain a node');
      eq(pdbs[0].spec.selector.matchLabels, dep.spec.selector.matchLabels, 'PDB selects the injector pods');
    }
  } else {
    eq(pdbs.length, 0, 'no PodDisruptionBudget with one replica');
  }

  // ---- The sidecar's config ----
  const cmName = `${release}-sidecar-config`;
  const cms = all('ConfigMap').filter((m) => m.metadata.name === cmName);
  const wantNs = v.sidecar.configNamespaces.length ? v.sidecar.configNamespaces : [ns];
  eq(cms.map((m) => m.metadata.namespace).sort(), [...wantNs].sort(), `ConfigMap ${cmName} namespaces`);
  const text = cms.length ? cms[0].data['config.yaml'] : '';
  check(typeof text === 'string' && text.length > 0, 'ConfigMap holds config.yaml (the key the injector mounts)');
  let cfg = {};
  try {
    cfg = YAML.parse(text || '') || {};
  } catch (e) {
    check(false, `config.yaml parses: ${e.message}`);
  }
  for (const k of Object.keys(cfg)) check(['listen', 'upstream', 'backend', 'stores', 'protect', 'limits', 'log', 'shutdown_grace_ms', 'app_health'].includes(k), `config key ${k} is one fencegate knows`);
  eq(cfg.listen, { resp: '127.0.0.1:6380', http: '0.0.0.0:8380' }, 'config listen (RESP on loopback, HTTP on the pod IP for probes)');
  const wantBackend = { url: backend, prefix: v.sidecar.backend.prefix, session_ttl_ms: v.sidecar.sessionTtlMs };
  const tlsv = v.sidecar.backend.tls || {};
  for (const [key, val] of [['password_file', v.sidecar.backend.passwordFile], ['tls_ca_file', tlsv.caFile], ['tls_cert_file', tlsv.certFile], ['tls_key_file', tlsv.keyFile], ['tls_server_name', tlsv.serverName]]) {
    if (val) wantBackend[key] = val; // set values only: an empty one is left out
  }
  eq(cfg.backend, wantBackend, 'config backend');
  eq(cfg.stores, [{ name: v.sidecar.upstream.storeName, url: v.sidecar.upstream.url }, ...v.sidecar.stores], 'config stores, the upstream first');
  eq(cfg.protect || [], v.sidecar.protect, 'config protect rules');
  const ah = v.sidecar.appHealth;
  if (ah.url) {
    eq(cfg.app_health, { url: ah.url, interval_ms: ah.intervalMs, timeout_ms: ah.timeoutMs, failure_threshold: ah.failureThreshold }, 'config app_health (sidecar.appHealth.url is set)');
  } else {
    check(!('app_health' in cfg), `no config app_health while sidecar.appHealth.url is empty (got ${JSON.stringify(cfg.app_health)})`);
  }
  eq(cfg.log, { level: v.sidecar.logLevel }, 'config log');
  eq(cfg.shutdown_grace_ms, v.sidecar.shutdownGraceMs, 'config shutdown_grace_ms');
  if (configOut && text) fs.writeFileSync(configOut, text);

  // ---- TLS ----
  const secrets = all('Secret');
  const certs = all('Certificate');
  const annotations = mwc.metadata.annotations || {};
  if (mode === 'generated') {
    const s = secrets.find((x) => x.metadata.name === secretName) || { data: {} };
    eq(s.type, 'kubernetes.io/tls', 'TLS Secret type');
    eq(wh.clientConfig.caBundle, s.data['ca.crt'], 'caBundle is the Secret\'s CA');
    eq(annotations['cert-manager.io/inject-ca-from'], undefined, 'no cert-manager annotation');
    eq((pod.metadata.annotations || {})['checksum/tls'], crypto.createHash('sha256').update(s.data['tls.crt'] || '').digest('hex'), 'injector pods roll when the certificate changes');
    try {
      const crt = new crypto.X509Certificate(Buffer.from(s.data['tls.crt'], 'base64'));
      const ca = new crypto.X509Certificate(Buffer.from(s.data['ca.crt'], 'base64'));
      check(crt.verify(ca.publicKey), 'the serving certificate is signed by the CA of caBundle');
      check(ca.ca, 'ca.crt is a CA certificate');
      check((crt.subjectAltName || '').includes(`DNS:${injector}.${ns}.svc`), `certificate names ${injector}.${ns}.svc (${crt.subjectAltName})`);
      const days = (Date.parse(crt.validTo) - Date.now()) / 86400000;
      check(days > v.tls.validityDays - 2, `certificate valid for ${v.tls.validityDays} days (${Math.round(days)})`);
      const key = crypto.createPrivateKey(Buffer.from(s.data['tls.key'], 'base64'));
      check(crt.checkPrivateKey(key), 'tls.key matches tls.crt');
    } catch (e) {
      check(false, `TLS material reads: ${e.message}`);
    }
    eq(certs.length, 0, 'no Certificate');
  } else if (mode === 'cert-manager') {
    eq(secrets.length, 0, 'no Secret rendered (cert-manager writes it)');
    eq(wh.clientConfig.caBundle, undefined, 'no caBundle (cert-manager injects it)');
    const cert = one('Certificate');
    eq(annotations['cert-manager.io/inject-ca-from'], `${ns}/${cert.metadata && cert.metadata.name}`, 'cert-manager.io/inject-ca-from names the Certificate');
    eq(cert.spec.secretName, secretName, 'Certificate writes the Secret the injector mounts');
    check(cert.spec.dnsNames.includes(`${injector}.${ns}.svc`), 'Certificate names the Service');
    check((cert.spec.usages || []).includes('server auth'), 'Certificate usage server auth');
    const ref = v.tls.certManager.issuerRef;
    if (ref.name) {
      eq(cert.spec.issuerRef, { name: ref.name, kind: ref.kind || 'Issuer', group: ref.group || 'cert-manager.io' }, 'Certificate uses the given issuer');
      eq(all('Issuer').length, 0, 'no Issuer of the chart');
    } else {
      const iss = one('Issuer');
      eq(cert.spec.issuerRef, { name: iss.metadata && iss.metadata.name, kind: 'Issuer', group: 'cert-manager.io' }, 'Certificate uses the chart\'s Issuer');
      eq(iss.spec, { selfSigned: {} }, 'the chart\'s Issuer is self-signed');
    }
  } else {
    eq(secrets.length, 0, 'no Secret rendered (the operator\'s is used)');
    eq(certs.length, 0, 'no Certificate');
    eq(wh.clientConfig.caBundle, v.tls.caBundle, 'caBundle from tls.caBundle');
  }

  if (failures.length) {
    for (const f of failures) console.log(`  FAIL ${path.basename(valuesFile)}: ${f}`);
    console.log(`assert: ${failures.length} of ${checks} checks failed for ${path.basename(valuesFile)} (TLS: ${mode})`);
    return 1;
  }
  console.log(`assert: ${checks} checks passed for ${path.basename(valuesFile)} (TLS: ${mode})`);
  return 0;
}

if (require.main === module) process.exit(main(process.argv.slice(2)));
