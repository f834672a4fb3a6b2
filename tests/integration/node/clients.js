'use strict';
// clients.js — runs the same scenarios with ioredis and node-redis v4 through fencegate and
// straight against Redis, compares the two, and prints one JSON line per scenario:
//   {"lib": "ioredis"|"node-redis", "scenario": NAME, "ok": true|false, "detail": TEXT}
// Exit status: 0 when every scenario passed, 1 otherwise, 2 on bad usage, 3 on the global timeout.
//
// usage: node clients.js --port P --direct-port R [--restart-via-stdio] [--only NAME,...]
//                        [--timeout SECONDS]
//   --port P             fencegate's RESP port (its upstream and lock backend: the Redis on R)
//   --direct-port R      the same Redis, reached without fencegate
//   --restart-via-stdio  also run "reconnect": print {"control":"restart-redis"} and wait for a
//                        line on stdin saying the Redis was restarted (the Python test does it)
//
// Every scenario runs twice, once with a key prefix of its own against fencegate and once against
// Redis; the values it returns (with the prefixes replaced by "<P>") must be equal, and the
// assertions inside it must hold both times. Scenarios about fencegate's lock commands run through
// fencegate only. Every wait is bounded.

const assert = require('node:assert/strict');
const crypto = require('node:crypto');
const readline = require('node:readline');
const { parseArgs } = require('node:util');
const IORedis = require('ioredis');
const { createClient, commandOptions } = require('redis');

// ---- command line -----------------------------------------------------------------------------

let opts;
try {
  opts = parseArgs({
    options: {
      port: { type: 'string' },
      'direct-port': { type: 'string' },
      'restart-via-stdio': { type: 'boolean', default: false },
      only: { type: 'string' },
      timeout: { type: 'string', default: '100' },
    },
  }).values;
} catch (e) {
  process.stderr.write(`clients.js: ${e.message}\n`);
  process.exit(2);
}
const FG_PORT = Number(opts.port);
const DIRECT_PORT = Number(opts['direct-port']);
if (!Number.isInteger(FG_PORT) || !Number.isInteger(DIRECT_PORT) || FG_PORT <= 0 ||
    DIRECT_PORT <= 0) {
  process.stderr.write('usage: node clients.js --port FENCEGATE_PORT --direct-port REDIS_PORT ' +
                       '[--restart-via-stdio] [--only NAME,...] [--timeout SECONDS]\n');
  process.exit(2);
}
const ONLY = opts.only ? new Set(opts.only.split(',')) : null;
const HOST = '127.0.0.1';
const SCENARIO_TIMEOUT_MS = 20000;
const RECOVERY_TIMEOUT_MS = 30000;
const RUN_ID = crypto.randomBytes(4).toString('hex'); // keeps reruns on one Redis apart
const BIG = crypto.randomBytes(1 << 20);
const ALL_BYTES = Buffer.from(Array.from({ length: 256 }, (_, i) => i));

let failures = 0;
function report(lib, scenario, ok, detail) {
  if (!ok) failures++;
  process.stdout.write(JSON.stringify({ lib, scenario, ok, detail }) + '\n');
}

// A scenario that forgets a promise must not kill the whole run; it fails on its own timeout.
process.on('unhandledRejection', (e) => {
  process.stderr.write(`clients.js: unhandled rejection: ${e && e.stack ? e.stack : e}\n`);
});

const watchdog = setTimeout(() => {
  report('-', 'global-timeout', false, `clients.js did not finish within ${opts.timeout} s`);
  process.exit(3);
}, Number(opts.timeout) * 1000);

// ---- helpers ------------------------------------------------------------------------------------

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function withTimeout(promise, ms, what) {
  let timer;
  const t = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms: ${what}`)), ms);
  });
  return Promise.race([promise, t]).finally(() => clearTimeout(timer));
}

async function waitFor(pred, ms, what) {
  const deadline = Date.now() + ms;
  while (!pred()) {
    if (Date.now() >= deadline) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    await sleep(10);
  }
}

// The outcome of a promise as a value: {error: message} instead of a rejection.
async function settle(p) {
  try {
    return await p;
  } catch (e) {
    return { error: e && e.message !== undefined ? e.message : String(e) };
  }
}

const sha = (b) => crypto.createHash('sha256').update(b).digest('hex');

function errText(e) {
  if (!e) return String(e);
  let s = e.message || String(e);
  if (e.previousErrors) s += ' [' + e.previousErrors.map((x) => x.message).join('; ') + ']';
  return s;
}

// Turns a scenario's result into plain JSON with the run-specific strings replaced, so that the
// run through fencegate and the run against Redis compare equal when they behave the same.
function normalize(v, ctx) {
  const fix = (s) => ctx.tokens.reduce((acc, [from, to]) => acc.split(from).join(to), s);
  const walk = (x) => {
    if (x === undefined || x === null) return null;
    if (Buffer.isBuffer(x)) {
      return x.length <= 300 ? { buffer: fix(x.toString('latin1')) }
                             : { buffer_sha256: sha(x), length: x.length };
    }
    if (x instanceof Error) return { error: fix(errText(x)) };
    if (typeof x === 'string') return fix(x);
    if (typeof x === 'bigint') return x.toString();
    if (typeof x === 'number' || typeof x === 'boolean') return x;
    if (Array.isArray(x)) return x.map(walk);
    if (x instanceof Map) return walk(Object.fromEntries(x));
    if (x instanceof Set) return [...x].map(walk).sort();
    if (typeof x === 'object') {
      const out = {};
      for (const k of Object.keys(x).sort()) out[fix(k)] = walk(x[k]);
      return out;
    }
    return String(x);
  };
  return walk(v);
}

const short = (v, n = 300) => {
  const s = JSON.stringify(v);
  return s.length > n ? s.slice(0, n) + `... (${s.length} chars)` : s;
};

// ---- client libraries ---------------------------------------------------------------------------

// Each adapter opens a connected client and closes it; scenarios call the library's own API.
const LIBS = {
  ioredis: {
    async open(port, extra = {}) {
      const c = new IORedis({
        host: HOST,
        port,
        lazyConnect: true,
        connectTimeout: 5000,
        commandTimeout: 15000,
        maxRetriesPerRequest: 1,
        retryStrategy: () => null, // a dropped connection is a failure here, not retried
        ...extra,
      });
      c.on('error', (e) => { c.lastError = e; });
      await c.connect();
      return c;
    },
    close(c) {
      c.disconnect();
    },
  },
  'node-redis': {
    async open(port, extra = {}) {
      const { socket = {}, ...rest } = extra;
      const c = createClient({
        socket: { host: HOST, port, connectTimeout: 5000, reconnectStrategy: false, ...socket },
        ...rest,
      });
      c.on('error', (e) => { c.lastError = e; });
      await c.connect();
      return c;
    },
    async close(c) {
      if (c.isOpen) await c.disconnect().catch(() => {});
    },
  },
};

class Ctx {
  constructor(lib, scenario, target) {
    this.lib = lib;
    this.target = target;
    this.port = target === 'fencegate' ? FG_PORT : DIRECT_PORT;
    this.prefix = `nt:${RUN_ID}:${lib}:${scenario}:${target}:`;
    this.nameBase = `nt-${RUN_ID}-${lib}-${target}`;
    this.tokens = [[this.prefix, '<P>'], [this.nameBase, '<N>']];
    this.clients = [];
  }

  k(name) {
    return this.prefix + name;
  }

  async client(extra) {
    const c = await LIBS[this.lib].open(this.port, extra);
    this.clients.push(c);
    return c;
  }

  // A client straight to Redis (also for the fencegate run): to check what really landed there.
  async admin(extra) {
    const c = await LIBS[this.lib].open(DIRECT_PORT, extra);
    this.clients.push(c);
    return c;
  }

  async close() {
    for (const c of this.clients) {
      try {
        await LIBS[this.lib].close(c);
      } catch (e) { /* already closed */ }
    }
  }
}

async function runScenario(lib, name, fn, { fgOnly = false } = {}) {
  if (ONLY && !ONLY.has(name)) return;
  const outcome = {};
  for (const target of fgOnly ? ['fencegate'] : ['fencegate', 'direct']) {
    const ctx = new Ctx(lib, name, target);
    try {
      const v = await withTimeout(fn(ctx), SCENARIO_TIMEOUT_MS, `${lib} ${name} (${target})`);
      outcome[target] = { ok: true, value: normalize(v, ctx) };
    } catch (e) {
      outcome[target] = { ok: false, error: errText(e) };
    } finally {
      await withTimeout(ctx.close(), 5000, 'closing clients').catch(() => {});
    }
  }
  const fg = outcome.fencegate;
  const direct = outcome.direct;
  if (!fg.ok) {
    report(lib, name, false, `through fencegate: ${fg.error}` +
           (direct ? (direct.ok ? ' (straight to Redis it passed)'
                                : ` (straight to Redis too: ${direct.error})`) : ''));
  } else if (direct && !direct.ok) {
    report(lib, name, false, `straight to Redis (the scenario itself is wrong): ${direct.error}`);
  } else if (direct && JSON.stringify(fg.value) !== JSON.stringify(direct.value)) {
    report(lib, name, false, `results differ: through fencegate ${short(fg.value, 700)}; ` +
           `straight to Redis ${short(direct.value, 700)}`);
  } else {
    report(lib, name, true, (direct ? 'same as Redis: ' : '') + short(fg.value));
  }
}

// ---- scenarios: ioredis -------------------------------------------------------------------------

const ioredisScenarios = {
  async connect_ping(c) {
    const r = await c.client();
    return {
      status: r.status,
      ping: await r.ping(),
      pingMsg: await r.ping('hello there'),
      echo: await r.echoBuffer(Buffer.from([0, 13, 10, 255, 36, 42])),
    };
  },

  async binary_buffers(c) {
    const r = await c.client();
    const binKey = Buffer.concat([Buffer.from(c.k('bin:')), Buffer.from([0xff, 0, 13, 10, 0x2a])]);
    const out = {};
    out.setBin = await r.set(binKey, ALL_BYTES);
    const got = await r.getBuffer(binKey);
    assert.ok(got.equals(ALL_BYTES), 'the 256-byte value came back changed');
    out.gotBin = got;
    out.setBig = await r.set(c.k('big'), BIG);
    const big = await r.getBuffer(c.k('big'));
    assert.ok(big.equals(BIG), `the 1 MiB value came back changed (length ${big && big.length})`);
    out.big = big;
    out.strlen = await r.strlen(c.k('big'));
    out.type = await r.type(binKey);
    out.mget = await r.mgetBuffer(binKey, c.k('missing'));
    out.keys = await r.keysBuffer(Buffer.concat([Buffer.from(c.k('bin:')), Buffer.from('*')]));
    // 40 MiB of replies to one pipeline: more than fencegate buffers per connection.
    const p = r.pipeline();
    for (let i = 0; i < 40; i++) p.getBuffer(c.k('big'));
    const many = await p.exec();
    out.bigPipeline = many.filter(([e, v]) => !e && v.equals(BIG)).length;
    assert.equal(out.bigPipeline, 40, 'replies of the 1 MiB pipeline came back changed');
    return out;
  },

  async pipeline_500(c) {
    const r = await c.client();
    await r.set(c.k('str'), 'abc');
    const p = r.pipeline();
    for (let i = 0; i < 500; i++) {
      switch (i % 5) {
        case 0: p.set(c.k(`p:${i}`), `v${i}`); break;
        case 1: p.incr(c.k('ctr')); break;
        case 2: p.get(c.k(`p:${i - 2}`)); break;
        case 3: p.rpush(c.k('list'), String(i)); break;
        default: p.hset(c.k('h'), `f${i}`, String(i));
      }
    }
    p.incr(c.k('str')); // an error reply in the middle of a pipeline
    p.lrange(c.k('list'), 0, 4);
    const res = await p.exec();
    assert.equal(res.length, 502);
    assert.equal(res[500][0] && res[500][0].message.startsWith('ERR'), true,
                 'INCR on a string did not fail');
    assert.equal(res.filter(([e]) => e).length, 1, 'unexpected errors in the pipeline');
    return res.map(([e, v]) => (e ? { error: e.message } : v));
  },

  async auto_pipelining_1000(c) {
    const r = await c.client({ enableAutoPipelining: true });
    const ops = [];
    for (let i = 0; i < 1000; i++) {
      switch (i % 4) {
        case 0: ops.push(r.set(c.k(`a:${i}`), `v${i}`)); break;
        case 1: ops.push(r.get(c.k(`a:${i - 1}`))); break;
        case 2: ops.push(r.incr(c.k('ctr'))); break;
        default: ops.push(r.hincrby(c.k('h'), `f${i % 7}`, 1));
      }
    }
    const res = await Promise.all(ops);
    assert.equal(res.length, 1000);
    assert.equal(await r.get(c.k('ctr')), '250');
    for (let i = 1; i < 1000; i += 4) assert.equal(res[i], `v${i - 1}`, `reply ${i} out of order`);
    return res;
  },

  async multi_exec(c) {
    const r = await c.client();
    const out = {};
    out.tx = await r.multi().set(c.k('a'), '1').incr(c.k('a')).get(c.k('a'))
      .rpush(c.k('l'), 'x', 'y').lrange(c.k('l'), 0, -1).exec();
    assert.deepEqual(out.tx, [[null, 'OK'], [null, 2], [null, '2'], [null, 2], [null, ['x', 'y']]]);
    // A runtime error inside EXEC fails only its own command.
    out.runtimeError = (await r.multi().set(c.k('s'), 'abc').incr(c.k('s')).get(c.k('s')).exec())
      .map(([e, v]) => (e ? { error: e.message } : v));
    // A command refused while queueing aborts the whole transaction.
    out.queueError = await settle(r.multi().set(c.k('q'), '1').call('NOSUCHCOMMAND', 'x').exec()
      .catch((e) => { throw new Error(errText(e)); }));
    out.qAfterAbort = await r.exists(c.k('q'));
    // DISCARD leaves nothing behind and the connection usable.
    out.multi = await r.multi({ pipeline: false });
    out.queued = await r.set(c.k('d'), '1');
    out.discard = await r.discard();
    out.dAfterDiscard = await r.exists(c.k('d'));
    out.ping = await r.ping();
    return out;
  },

  async watch_conflict(c) {
    const a = await c.client();
    const b = await c.client();
    const out = {};
    await a.set(c.k('w'), '1');
    out.watch = await a.watch(c.k('w'));
    await b.set(c.k('w'), '2');
    out.conflict = await a.multi().set(c.k('w'), '3').exec();
    assert.equal(out.conflict, null, 'EXEC ran although a watched key changed');
    out.afterConflict = await a.get(c.k('w'));
    await a.watch(c.k('w'));
    out.noConflict = await a.multi().set(c.k('w'), '4').exec();
    out.final = await b.get(c.k('w'));
    assert.equal(out.final, '4');
    await a.watch(c.k('w'));
    out.unwatch = await a.unwatch();
    await b.set(c.k('w'), '5');
    out.afterUnwatch = await a.multi().incr(c.k('w')).exec();
    return out;
  },

  async select_db_option(c) {
    const r = await c.client({ db: 5 });
    const r0 = await c.client();
    const adm5 = await c.admin({ db: 5 });
    const out = {};
    out.set = await r.set(c.k('db'), 'five');
    out.get = await r.get(c.k('db'));
    out.inDb0 = await r0.exists(c.k('db'));
    out.redisDb5 = await adm5.get(c.k('db'));
    out.clientInfoDb = /\bdb=(\d+)/.exec(await r.client('INFO'))[1];
    assert.equal(out.inDb0, 0, 'the key landed in db 0');
    assert.equal(out.redisDb5, 'five', 'the key is not in db 5 of the Redis');
    return out;
  },

  async pubsub(c) {
    const sub = await c.client();
    const pub = await c.client();
    const got = [];
    sub.on('message', (ch, msg) => got.push(['message', ch, msg]));
    sub.on('pmessage', (pat, ch, msg) => got.push(['pmessage', pat, ch, msg]));
    sub.on('messageBuffer', (ch, msg) => {
      if (msg.length === 256) got.push(['messageBuffer', ch, msg]);
    });
    const out = {};
    out.subscribe = await sub.subscribe(c.k('a'), c.k('b'));
    out.psubscribe = await sub.psubscribe(c.k('p.*'));
    out.pingInSubscribe = await sub.ping();
    out.pub1 = await pub.publish(c.k('a'), 'hello');
    out.pub2 = await pub.publish(c.k('p.x'), 'world');
    out.pub3 = await pub.publish(c.k('b'), ALL_BYTES);
    await waitFor(() => got.length >= 4, 5000, 'four messages');
    out.unsubA = await sub.unsubscribe(c.k('a'));
    out.pubAfterUnsub = await pub.publish(c.k('a'), 'nobody listens');
    out.pubB = await pub.publish(c.k('b'), 'still here');
    await waitFor(() => got.length >= 5, 5000, 'the fifth message');
    out.numsub = await pub.pubsub('NUMSUB', c.k('a'), c.k('b'));
    // (named: ioredis 5 and node-redis 4 both hang on an argument-less UNSUBSCRIBE, even
    // straight against Redis)
    out.unsubRest = await sub.unsubscribe(c.k('b'));
    out.punsubRest = await sub.punsubscribe(c.k('p.*'));
    // Out of subscriber mode the same connection runs ordinary commands again.
    out.setAfter = await sub.set(c.k('after'), 'ok');
    out.getAfter = await sub.get(c.k('after'));
    await sleep(50);
    out.messages = got;
    return out;
  },

  async blpop_wakeup(c) {
    const a = await c.client();
    const b = await c.client();
    const t0 = Date.now();
    const popped = a.blpop(c.k('q'), 5);
    await sleep(300);
    const pushed = await b.rpush(c.k('q'), 'job-1');
    const reply = await popped;
    const elapsed = Date.now() - t0;
    assert.ok(elapsed < 4000, `BLPOP woke after ${elapsed} ms`);
    const t1 = Date.now();
    const timedOut = await a.blpop(c.k('empty'), 0.3);
    const waited = Date.now() - t1;
    assert.ok(waited >= 250 && waited < 3000, `BLPOP 0.3 s timeout took ${waited} ms`);
    return { pushed, reply, timedOut, pingAfter: await a.ping() };
  },

  async scan_2000(c) {
    const r = await c.client();
    const p = r.pipeline();
    for (let i = 0; i < 2000; i++) p.set(c.k(`s:${i}`), String(i));
    const res = await p.exec();
    assert.ok(res.every(([e, v]) => !e && v === 'OK'));
    const seen = new Set();
    let cursor = '0';
    let rounds = 0;
    do {
      const [next, keys] = await r.scan(cursor, 'MATCH', c.k('s:*'), 'COUNT', 100);
      keys.forEach((k) => seen.add(k));
      cursor = next;
      rounds++;
    } while (cursor !== '0' && rounds < 100000);
    assert.equal(seen.size, 2000, `SCAN found ${seen.size} of 2000 keys`);
    for (let i = 0; i < 2000; i++) assert.ok(seen.has(c.k(`s:${i}`)), `SCAN missed s:${i}`);
    const streamed = new Set();
    await new Promise((resolve, reject) => {
      const s = r.scanStream({ match: c.k('s:*'), count: 250 });
      s.on('data', (keys) => keys.forEach((k) => streamed.add(k)));
      s.on('end', resolve);
      s.on('error', reject);
    });
    assert.equal(streamed.size, 2000, `scanStream found ${streamed.size} of 2000 keys`);
    return { scan: seen.size, scanStream: streamed.size };
  },

  async eval_lua(c) {
    const r = await c.client();
    const out = {};
    const script = "redis.call('SET', KEYS[1], ARGV[1]); " +
      "return {redis.call('GET', KEYS[1]), redis.call('INCRBY', KEYS[2], ARGV[2]), 3.99, " +
      "{1, 'two'}, redis.status_reply('FINE'), #ARGV[1]}";
    out.eval = await r.eval(script, 2, c.k('e1'), c.k('e2'), 'val\r\nue', 5);
    out.evalBin = await r.evalBuffer('return ARGV[1]', 0, ALL_BYTES);
    out.errorReply = await settle(r.eval("return redis.error_reply('MYERR boom')", 0));
    out.runtimeError = await settle(r.eval("return redis.call('INCR', KEYS[1])", 1, c.k('e1')));
    const sha1 = await r.script('LOAD', 'return {KEYS[1], ARGV[1]}');
    out.evalsha = await r.evalsha(sha1, 1, c.k('x'), 'y');
    r.defineCommand('fgPair', { numberOfKeys: 1, lua: "return {KEYS[1], ARGV[1], 'def'}" });
    out.defined = await r.fgPair(c.k('y'), 'z');
    out.noscript = await settle(r.evalsha('0'.repeat(40), 0));
    return out;
  },

  async client_name(c) {
    const name = `${c.nameBase}-named`;
    const r = await c.client({ connectionName: name });
    const adm = await c.admin();
    const out = {};
    out.getname = await r.client('GETNAME');
    assert.equal(out.getname, name);
    const list = await adm.client('LIST');
    out.redisSeesName = list.split('\n').some((l) => l.includes(` name=${name} `));
    assert.ok(out.redisSeesName, 'CLIENT LIST on the Redis does not show the name');
    out.rename = await r.client('SETNAME', `${name}-2`);
    out.getname2 = await r.client('GETNAME');
    return out;
  },

  // Transactions on a connection that holds a lock (fencegate then holds MULTI back and runs
  // the block itself at EXEC): the library must see what Redis alone gives it.
  async fenced_multi(c) {
    const a = await c.client();
    const b = await c.client();
    const lock = `fmulti-${RUN_ID}-${c.lib}`;
    let token = null;
    if (c.target === 'fencegate') {
      token = await a.call('FENCE.ACQUIRE', lock);
      assert.ok(Number.isInteger(token), `FENCE.ACQUIRE returned ${short(token)}`);
    }
    const out = {};
    out.tx = await a.multi().set(c.k('a'), '1').incr(c.k('a')).get(c.k('a'))
      .rpush(c.k('l'), 'x', 'y').lrange(c.k('l'), 0, -1).exec();
    out.runtimeError = (await a.multi().set(c.k('s'), 'abc').incr(c.k('s')).get(c.k('s')).exec())
      .map(([e, v]) => (e ? { error: e.message } : v));
    out.queueError = await settle(a.multi().set(c.k('q'), '1').call('NOSUCHCOMMAND', 'x').exec()
      .catch((e) => { throw new Error(errText(e)); }));
    out.arityError = await settle(a.multi().set(c.k('q'), '1').call('GET').exec()
      .catch((e) => { throw new Error(errText(e)); }));
    out.qAfterAbort = await a.exists(c.k('q'));
    await a.set(c.k('w'), '1');
    out.watch = await a.watch(c.k('w'));
    await b.set(c.k('w'), '2');
    out.conflict = await a.multi().set(c.k('w'), '3').exec();
    out.afterConflict = await a.get(c.k('w'));
    await a.watch(c.k('w'));
    out.noConflict = await a.multi().set(c.k('w'), '4').exec();
    out.final = await b.get(c.k('w'));
    out.multi = await a.multi({ pipeline: false });
    out.queued = await a.set(c.k('d'), '1');
    out.discard = await a.discard();
    out.dAfterDiscard = await a.exists(c.k('d'));
    if (token !== null) {
      assert.equal(await a.call('FENCE.TOKEN', lock), token, 'the lock was lost on the way');
      assert.equal(await a.call('FENCE.RELEASE', lock), 1);
    }
    return out;
  },

  async fence_lock(c) {
    const lock = 'job';
    const r = await c.client();
    const other = await c.client();
    const adm = await c.admin();
    const out = {};
    const token = await r.call('FENCE.ACQUIRE', lock);
    assert.ok(Number.isInteger(token) && token > 0, `FENCE.ACQUIRE returned ${short(token)}`);
    out.token = await r.call('FENCE.TOKEN', lock);
    assert.equal(out.token, token, 'FENCE.TOKEN differs from the acquired token');
    out.fencedSet = await r.set(c.k('fenced'), 'v1');
    assert.equal(out.fencedSet, 'OK');
    assert.equal(await adm.get(c.k('fenced')), 'v1', 'the fenced SET did not reach Redis');
    assert.equal(Number(await adm.get(`fencegate:hwm:{${lock}}`)), token,
                 'the high-water mark is not the token');
    out.locked = await settle(other.call('FENCE.ACQUIRE', lock));
    assert.match(String(out.locked.error), /^LOCKED/, 'a second holder got the lock');
    const locks = await r.call('FENCE.LOCKS');
    assert.equal(locks.length, 1);
    assert.equal(String(locks[0][0]), lock);
    assert.equal(Number(locks[0][1]), token);
    out.released = await r.call('FENCE.RELEASE', lock);
    assert.equal(out.released, 1);
    const token2 = await other.call('FENCE.ACQUIRE', lock);
    assert.ok(token2 > token, `token ${token2} after ${token}`);
    out.released2 = await other.call('FENCE.RELEASE', lock);
    // A pipeline: the write behind FENCE.ACQUIRE is already fenced.
    const pl = await r.pipeline().call('FENCE.ACQUIRE', `${lock}-p`).set(c.k('pfenced'), 'v2')
      .call('FENCE.TOKEN', `${lock}-p`).call('FENCE.RELEASE', `${lock}-p`).exec();
    assert.ok(pl.every(([e]) => !e), `pipeline errors: ${short(pl)}`);
    assert.ok(Number.isInteger(pl[0][1]) && pl[0][1] === pl[2][1], short(pl));
    out.pipelineSet = pl[1][1];
    // A lease that ran out: the write is refused and nothing reaches Redis.
    // A connection is a lock session: closing it releases its locks.
    const session = `${lock}-session-${RUN_ID}`;
    const gone = await c.client();
    assert.ok(Number.isInteger(await gone.call('FENCE.ACQUIRE', session)));
    await gone.quit();
    out.afterClose = await settle(other.call('FENCE.ACQUIRE', session, 'WAIT', 5000));
    assert.ok(Number.isInteger(out.afterClose),
              `lock of a closed connection: ${short(out.afterClose)}`);
    out.afterCloseReleased = await other.call('FENCE.RELEASE', session);
    const lost = `${lock}-lost-${RUN_ID}`;
    await r.call('FENCE.ACQUIRE', lost, 'TTL', 500, 'NORENEW');
    await sleep(800);
    out.lostWrite = await settle(r.set(c.k('stale'), 'x'));
    assert.match(String(out.lostWrite.error), /^LOCKLOST/, short(out.lostWrite));
    assert.equal(await adm.exists(c.k('stale')), 0, 'a write under a lost lock reached Redis');
    return out;
  },
};

// ---- scenarios: node-redis v4 -------------------------------------------------------------------

const bufs = commandOptions({ returnBuffers: true });

// node-redis returns reply errors inside multi/pipeline results as ErrorReply objects.
const replies = (arr) => arr.map((v) => (v instanceof Error ? { error: v.message } : v));

// node-redis 4.7 rejects exec()/execAsPipeline() with a MultiErrorReply when some commands
// failed; its .replies hold every reply, errors in place.
async function execReplies(promise) {
  try {
    return replies(await promise);
  } catch (e) {
    if (Array.isArray(e.replies)) return replies(e.replies);
    throw e;
  }
}

const nodeRedisScenarios = {
  async connect_ping(c) {
    const r = await c.client();
    return {
      isReady: r.isReady,
      ping: await r.ping(),
      pingMsg: await r.ping('hello there'),
      echo: await r.sendCommand(['ECHO', Buffer.from([0, 13, 10, 255, 36, 42])], bufs),
    };
  },

  async binary_buffers(c) {
    const r = await c.client();
    const binKey = Buffer.concat([Buffer.from(c.k('bin:')), Buffer.from([0xff, 0, 13, 10, 0x2a])]);
    const out = {};
    out.setBin = await r.set(binKey, ALL_BYTES);
    const got = await r.get(bufs, binKey);
    assert.ok(Buffer.isBuffer(got) && got.equals(ALL_BYTES),
              'the 256-byte value came back changed');
    out.gotBin = got;
    out.setBig = await r.set(c.k('big'), BIG);
    const big = await r.get(bufs, c.k('big'));
    assert.ok(big.equals(BIG), `the 1 MiB value came back changed (length ${big && big.length})`);
    out.big = big;
    out.strlen = await r.strLen(c.k('big'));
    out.type = await r.type(binKey);
    out.mget = await r.mGet(bufs, [binKey, c.k('missing')]);
    out.keys = await r.keys(bufs, Buffer.concat([Buffer.from(c.k('bin:')), Buffer.from('*')]));
    // 40 MiB of replies to commands written at once: more than fencegate buffers per connection.
    const many = await Promise.all(Array.from({ length: 40 }, () => r.get(bufs, c.k('big'))));
    out.bigPipeline = many.filter((v) => v.equals(BIG)).length;
    assert.equal(out.bigPipeline, 40, 'replies of the 1 MiB pipeline came back changed');
    return out;
  },

  async pipeline_500(c) {
    const r = await c.client();
    await r.set(c.k('str'), 'abc');
    const m = r.multi();
    for (let i = 0; i < 500; i++) {
      switch (i % 5) {
        case 0: m.set(c.k(`p:${i}`), `v${i}`); break;
        case 1: m.incr(c.k('ctr')); break;
        case 2: m.get(c.k(`p:${i - 2}`)); break;
        case 3: m.rPush(c.k('list'), String(i)); break;
        default: m.hSet(c.k('h'), `f${i}`, String(i));
      }
    }
    m.lRange(c.k('list'), 0, 4);
    const res = await execReplies(m.execAsPipeline());
    assert.equal(res.length, 501);
    // An error reply in a pipeline: node-redis 4 rejects execAsPipeline with the first error.
    const withError = await settle(r.multi().get(c.k('p:0')).incr(c.k('str')).get(c.k('p:5'))
      .execAsPipeline());
    // The same 500 commands issued at once: node-redis writes them in one batch per tick.
    const ops = [];
    for (let i = 0; i < 500; i++) {
      ops.push(i % 2 ? r.get(c.k(`c:${i - 1}`)) : r.set(c.k(`c:${i}`), `v${i}`));
    }
    const auto = await Promise.all(ops);
    for (let i = 1; i < 500; i += 2) assert.equal(auto[i], `v${i - 1}`, `reply ${i} out of order`);
    return { pipeline: res, withError, concurrent: auto };
  },

  async multi_exec(c) {
    const r = await c.client();
    const out = {};
    out.tx = await r.multi().set(c.k('a'), '1').incr(c.k('a')).get(c.k('a'))
      .rPush(c.k('l'), ['x', 'y']).lRange(c.k('l'), 0, -1).exec();
    assert.deepEqual(out.tx, ['OK', 2, '2', 2, ['x', 'y']]);
    out.runtimeError = await execReplies(r.multi().set(c.k('s'), 'abc').incr(c.k('s'))
      .get(c.k('s')).exec());
    out.queueError = await settle(r.multi().set(c.k('q'), '1').addCommand(['NOSUCHCOMMAND', 'x'])
      .exec());
    out.qAfterAbort = await r.exists(c.k('q'));
    out.ping = await r.ping();
    return out;
  },

  async watch_conflict(c) {
    const a = await c.client();
    const b = await c.client();
    const out = {};
    await a.set(c.k('w'), '1');
    out.watch = await a.watch(c.k('w'));
    await b.set(c.k('w'), '2');
    try {
      out.conflict = await a.multi().set(c.k('w'), '3').exec();
    } catch (e) {
      out.conflict = { thrown: e.constructor.name, message: e.message };
    }
    assert.equal(out.conflict.thrown, 'WatchError',
                 `EXEC after a conflict: ${short(out.conflict)}`);
    out.afterConflict = await a.get(c.k('w'));
    await a.watch(c.k('w'));
    out.noConflict = await a.multi().set(c.k('w'), '4').exec();
    out.final = await b.get(c.k('w'));
    assert.equal(out.final, '4');
    await a.watch(c.k('w'));
    out.unwatch = await a.unwatch();
    await b.set(c.k('w'), '5');
    out.afterUnwatch = await a.multi().incr(c.k('w')).exec();
    return out;
  },

  async select_db_option(c) {
    const r = await c.client({ database: 5 });
    const r0 = await c.client();
    const adm5 = await c.admin({ database: 5 });
    const out = {};
    out.set = await r.set(c.k('db'), 'five');
    out.get = await r.get(c.k('db'));
    out.inDb0 = await r0.exists(c.k('db'));
    out.redisDb5 = await adm5.get(c.k('db'));
    out.clientInfoDb = /\bdb=(\d+)/.exec(await r.sendCommand(['CLIENT', 'INFO']))[1];
    assert.equal(out.inDb0, 0, 'the key landed in db 0');
    assert.equal(out.redisDb5, 'five', 'the key is not in db 5 of the Redis');
    return out;
  },

  async pubsub(c) {
    const sub = await c.client();
    const pub = await c.client();
    const got = [];
    const out = {};
    await sub.subscribe([c.k('a'), c.k('b')], (msg, ch) => got.push(['message', ch, msg]));
    await sub.pSubscribe(c.k('p.*'), (msg, ch) => got.push(['pmessage', ch, msg]));
    await sub.subscribe(c.k('bin'), (msg, ch) => got.push(['buffer', ch, msg]), true);
    out.pub1 = await pub.publish(c.k('a'), 'hello');
    out.pub2 = await pub.publish(c.k('p.x'), 'world');
    out.pub3 = await pub.publish(c.k('bin'), ALL_BYTES);
    await waitFor(() => got.length >= 3, 5000, 'three messages');
    await sub.unsubscribe(c.k('a'));
    out.pubAfterUnsub = await pub.publish(c.k('a'), 'nobody listens');
    out.pubB = await pub.publish(c.k('b'), 'still here');
    await waitFor(() => got.length >= 4, 5000, 'the fourth message');
    out.numsub = await pub.pubSubNumSub([c.k('a'), c.k('b')]);
    out.patterns = await pub.pubSubNumPat();
    // (named: node-redis 4 hangs on an argument-less UNSUBSCRIBE, even straight against Redis)
    await sub.unsubscribe([c.k('b'), c.k('bin')]);
    await sub.pUnsubscribe(c.k('p.*'));
    // Out of subscriber mode the same connection runs ordinary commands again.
    out.setAfter = await sub.set(c.k('after'), 'ok');
    out.getAfter = await sub.get(c.k('after'));
    await sleep(50);
    out.messages = got;
    return out;
  },

  async blpop_wakeup(c) {
    const a = await c.client();
    const b = await c.client();
    const t0 = Date.now();
    const popped = a.blPop(c.k('q'), 5);
    await sleep(300);
    const pushed = await b.rPush(c.k('q'), 'job-1');
    const reply = await popped;
    const elapsed = Date.now() - t0;
    assert.ok(elapsed < 4000, `BLPOP woke after ${elapsed} ms`);
    const t1 = Date.now();
    const timedOut = await a.blPop(c.k('empty'), 0.3);
    const waited = Date.now() - t1;
    assert.ok(waited >= 250 && waited < 3000, `BLPOP 0.3 s timeout took ${waited} ms`);
    return { pushed, reply, timedOut, pingAfter: await a.ping() };
  },

  async scan_2000(c) {
    const r = await c.client();
    const m = r.multi();
    for (let i = 0; i < 2000; i++) m.set(c.k(`s:${i}`), String(i));
    const res = await m.execAsPipeline();
    assert.ok(res.every((v) => v === 'OK'));
    const seen = new Set();
    for await (const k of r.scanIterator({ MATCH: c.k('s:*'), COUNT: 100 })) seen.add(k);
    assert.equal(seen.size, 2000, `scanIterator found ${seen.size} of 2000 keys`);
    for (let i = 0; i < 2000; i++) assert.ok(seen.has(c.k(`s:${i}`)), `SCAN missed s:${i}`);
    const manual = new Set();
    let cursor = 0;
    let rounds = 0;
    do {
      const reply = await r.scan(cursor, { MATCH: c.k('s:*'), COUNT: 250 });
      reply.keys.forEach((k) => manual.add(k));
      cursor = reply.cursor;
      rounds++;
    } while (cursor !== 0 && rounds < 100000);
    assert.equal(manual.size, 2000, `SCAN found ${manual.size} of 2000 keys`);
    return { scanIterator: seen.size, scan: manual.size };
  },

  async eval_lua(c) {
    const r = await c.client();
    const out = {};
    const script = "redis.call('SET', KEYS[1], ARGV[1]); " +
      "return {redis.call('GET', KEYS[1]), redis.call('INCRBY', KEYS[2], ARGV[2]), 3.99, " +
      "{1, 'two'}, redis.status_reply('FINE'), #ARGV[1]}";
    out.eval = await r.eval(script, { keys: [c.k('e1'), c.k('e2')],
                                      arguments: ['val\r\nue', '5'] });
    out.evalBin = await r.eval(bufs, 'return ARGV[1]', { arguments: [ALL_BYTES] });
    out.errorReply = await settle(r.eval("return redis.error_reply('MYERR boom')"));
    out.runtimeError = await settle(r.eval("return redis.call('INCR', KEYS[1])",
                                           { keys: [c.k('e1')] }));
    const sha1 = await r.scriptLoad('return {KEYS[1], ARGV[1]}');
    out.evalsha = await r.evalSha(sha1, { keys: [c.k('x')], arguments: ['y'] });
    out.noscript = await settle(r.evalSha('0'.repeat(40)));
    return out;
  },

  async client_name(c) {
    const name = `${c.nameBase}-named`;
    const r = await c.client({ name });
    const adm = await c.admin();
    const out = {};
    out.getname = await r.clientGetName();
    assert.equal(out.getname, name);
    const list = await adm.sendCommand(['CLIENT', 'LIST']);
    out.redisSeesName = list.split('\n').some((l) => l.includes(` name=${name} `));
    assert.ok(out.redisSeesName, 'CLIENT LIST on the Redis does not show the name');
    out.rename = await r.clientSetName(`${name}-2`);
    out.getname2 = await r.clientGetName();
    return out;
  },

  // node-redis v4 speaks RESP2 only; its reply transformations must see RESP2 shapes.
  async resp2_defaults(c) {
    const r = await c.client();
    const out = {};
    out.respVersion = /\bresp=(\d+)/.exec(await r.sendCommand(['CLIENT', 'INFO']))[1];
    assert.equal(out.respVersion, '2');
    out.hSet = await r.hSet(c.k('h'), { a: '1', b: '2' });
    out.hGetAll = await r.hGetAll(c.k('h'));
    assert.deepEqual({ ...out.hGetAll }, { a: '1', b: '2' });
    out.hGetAllRaw = await r.sendCommand(['HGETALL', c.k('h')]);
    out.zAdd = await r.zAdd(c.k('z'), [{ score: 1.5, value: 'x' }, { score: 2, value: 'y' }]);
    out.zRangeWithScores = await r.zRangeWithScores(c.k('z'), 0, -1);
    assert.deepEqual(out.zRangeWithScores, [{ value: 'x', score: 1.5 }, { value: 'y', score: 2 }]);
    out.incrByFloat = await r.incrByFloat(c.k('f'), 0.1);
    out.sAdd = await r.sAdd(c.k('set'), ['m1', 'm2', 'm3']);
    out.sMembers = (await r.sMembers(c.k('set'))).sort();
    out.sIsMember = await r.sIsMember(c.k('set'), 'm2');
    out.nil = await r.get(c.k('missing'));
    out.exists = await r.exists([c.k('h'), c.k('z'), c.k('missing')]);
    out.ttl = await r.ttl(c.k('h'));
    out.wrongType = await settle(r.lPush(c.k('h'), 'x'));
    out.config = await r.configGet('maxmemory-policy');
    return out;
  },

  async fenced_multi(c) {
    const a = await c.client();
    const b = await c.client();
    const lock = `fmulti-${RUN_ID}-${c.lib}`;
    let token = null;
    if (c.target === 'fencegate') {
      token = await a.sendCommand(['FENCE.ACQUIRE', lock]);
      assert.ok(Number.isInteger(token), `FENCE.ACQUIRE returned ${short(token)}`);
    }
    const out = {};
    out.tx = await a.multi().set(c.k('a'), '1').incr(c.k('a')).get(c.k('a'))
      .rPush(c.k('l'), ['x', 'y']).lRange(c.k('l'), 0, -1).exec();
    out.runtimeError = await execReplies(a.multi().set(c.k('s'), 'abc').incr(c.k('s'))
      .get(c.k('s')).exec());
    out.queueError = await settle(a.multi().set(c.k('q'), '1').addCommand(['NOSUCHCOMMAND', 'x'])
      .exec());
    out.arityError = await settle(a.multi().set(c.k('q'), '1').addCommand(['GET']).exec());
    out.qAfterAbort = await a.exists(c.k('q'));
    await a.set(c.k('w'), '1');
    out.watch = await a.watch(c.k('w'));
    await b.set(c.k('w'), '2');
    try {
      out.conflict = await a.multi().set(c.k('w'), '3').exec();
    } catch (e) {
      out.conflict = { thrown: e.constructor.name, message: e.message };
    }
    out.afterConflict = await a.get(c.k('w'));
    await a.watch(c.k('w'));
    out.noConflict = await a.multi().set(c.k('w'), '4').exec();
    out.final = await b.get(c.k('w'));
    if (token !== null) {
      assert.equal(await a.sendCommand(['FENCE.TOKEN', lock]), token, 'the lock was lost');
      assert.equal(await a.sendCommand(['FENCE.RELEASE', lock]), 1);
    }
    return out;
  },

  async fence_lock(c) {
    const lock = 'job';
    const r = await c.client();
    const other = await c.client();
    const adm = await c.admin();
    const out = {};
    const token = await r.sendCommand(['FENCE.ACQUIRE', lock]);
    assert.ok(Number.isInteger(token) && token > 0, `FENCE.ACQUIRE returned ${short(token)}`);
    out.token = await r.sendCommand(['FENCE.TOKEN', lock]);
    assert.equal(out.token, token, 'FENCE.TOKEN differs from the acquired token');
    out.fencedSet = await r.set(c.k('fenced'), 'v1');
    assert.equal(out.fencedSet, 'OK');
    assert.equal(await adm.get(c.k('fenced')), 'v1', 'the fenced SET did not reach Redis');
    assert.equal(Number(await adm.get(`fencegate:hwm:{${lock}}`)), token,
                 'the high-water mark is not the token');
    out.locked = await settle(other.sendCommand(['FENCE.ACQUIRE', lock]));
    assert.match(String(out.locked.error), /^LOCKED/, 'a second holder got the lock');
    const locks = await r.sendCommand(['FENCE.LOCKS']);
    assert.equal(locks.length, 1);
    assert.equal(String(locks[0][0]), lock);
    assert.equal(Number(locks[0][1]), token);
    out.released = await r.sendCommand(['FENCE.RELEASE', lock]);
    assert.equal(out.released, 1);
    const token2 = await other.sendCommand(['FENCE.ACQUIRE', lock]);
    assert.ok(token2 > token, `token ${token2} after ${token}`);
    out.released2 = await other.sendCommand(['FENCE.RELEASE', lock]);
    const pl = await execReplies(r.multi().addCommand(['FENCE.ACQUIRE', `${lock}-p`])
      .set(c.k('pfenced'), 'v2').addCommand(['FENCE.TOKEN', `${lock}-p`])
      .addCommand(['FENCE.RELEASE', `${lock}-p`]).execAsPipeline());
    assert.ok(pl.every((v) => !(v && v.error)), `pipeline errors: ${short(pl)}`);
    assert.ok(Number.isInteger(pl[0]) && pl[0] === pl[2], short(pl));
    out.pipelineSet = pl[1];
    const session = `${lock}-session-${RUN_ID}`;
    const gone = await c.client();
    assert.ok(Number.isInteger(await gone.sendCommand(['FENCE.ACQUIRE', session])));
    await gone.quit();
    out.afterClose = await settle(other.sendCommand(['FENCE.ACQUIRE', session, 'WAIT', '5000']));
    assert.ok(Number.isInteger(out.afterClose),
              `lock of a closed connection: ${short(out.afterClose)}`);
    out.afterCloseReleased = await other.sendCommand(['FENCE.RELEASE', session]);
    const lost = `${lock}-lost-${RUN_ID}`;
    await r.sendCommand(['FENCE.ACQUIRE', lost, 'TTL', '500', 'NORENEW']);
    await sleep(800);
    out.lostWrite = await settle(r.set(c.k('stale'), 'x'));
    assert.match(String(out.lostWrite.error), /^LOCKLOST/, short(out.lostWrite));
    assert.equal(await adm.exists(c.k('stale')), 0, 'a write under a lost lock reached Redis');
    return out;
  },
};

// ---- reconnect: the Redis restarts under connected clients --------------------------------------

// Client options that keep reconnecting (the other scenarios treat a drop as a failure).
const RECONNECTING = {
  ioredis: (name) => ({ db: 3, connectionName: name, retryStrategy: (n) => Math.min(n * 100, 1000),
                        maxRetriesPerRequest: 1, commandTimeout: 3000 }),
  'node-redis': (name) => ({ database: 3, name,
                             socket: { reconnectStrategy: (n) => Math.min(n * 100, 1000) } }),
};

const call = (lib, client, args) => (lib === 'ioredis' ? client.call(...args)
                                                       : client.sendCommand(args.map(String)));

let stdinLines = null;
function nextStdinLine(ms) {
  if (!stdinLines) {
    stdinLines = { queue: [], waiters: [], closed: false };
    const rl = readline.createInterface({ input: process.stdin });
    rl.on('line', (l) => {
      const w = stdinLines.waiters.shift();
      if (w) w.resolve(l); else stdinLines.queue.push(l);
    });
    rl.on('close', () => {
      stdinLines.closed = true;
      stdinLines.waiters.splice(0).forEach((w) => w.reject(new Error('stdin closed')));
    });
  }
  if (stdinLines.queue.length) return Promise.resolve(stdinLines.queue.shift());
  if (stdinLines.closed) return Promise.reject(new Error('stdin closed'));
  return withTimeout(new Promise((resolve, reject) => stdinLines.waiters.push({ resolve, reject })),
                     ms, 'the test harness to restart Redis');
}

// Retries `fn` until it succeeds or `ms` pass; each attempt is bounded on its own.
async function until(fn, ms, what) {
  const deadline = Date.now() + ms;
  let last;
  for (;;) {
    try {
      return await withTimeout(Promise.resolve().then(fn), 3000, what);
    } catch (e) {
      last = e;
    }
    if (Date.now() >= deadline) {
      throw new Error(`${what}: still failing after ${ms} ms: ${errText(last)}`);
    }
    await sleep(100);
  }
}

async function reconnectScenario() {
  const libs = Object.keys(LIBS).filter(() => !ONLY || ONLY.has('reconnect'));
  if (!libs.length) return;
  if (!opts['restart-via-stdio']) {
    process.stderr.write('clients.js: "reconnect" not run (needs --restart-via-stdio)\n');
    return;
  }
  const entries = []; // {lib, target, ctx, client}
  const fail = {};
  try {
    for (const lib of libs) {
      for (const target of ['fencegate', 'direct']) {
        const ctx = new Ctx(lib, 'reconnect', target);
        const client = await withTimeout(ctx.client(RECONNECTING[lib](`${ctx.nameBase}-rc`)), 10000,
                                         `${lib} connect (${target})`);
        assert.equal(await client.set(ctx.k('before'), '1'), 'OK');
        // A subscriber: both libraries subscribe again by themselves after a reconnect.
        const sub = await withTimeout(ctx.client(RECONNECTING[lib](`${ctx.nameBase}-sub`)), 10000,
                                      `${lib} connect subscriber (${target})`);
        const heard = [];
        if (lib === 'ioredis') {
          sub.on('message', (ch, msg) => heard.push(msg));
          await sub.subscribe(ctx.k('ch'));
        } else {
          await sub.subscribe(ctx.k('ch'), (msg) => heard.push(msg));
        }
        entries.push({ lib, target, ctx, client, heard });
      }
    }
  } catch (e) {
    for (const lib of libs) fail[lib] = `before the restart: ${errText(e)}`;
  }
  if (!Object.keys(fail).length) {
    process.stdout.write(JSON.stringify({ control: 'restart-redis' }) + '\n');
    try {
      const line = await nextStdinLine(30000);
      if (line.trim() !== 'restarted') throw new Error(`the harness answered ${short(line)}`);
    } catch (e) {
      for (const lib of libs) fail[lib] = `restart: ${errText(e)}`;
    }
  }
  const results = {};
  await Promise.all(entries.map(async (e) => {
    if (fail[e.lib]) return;
    const { lib, ctx, client } = e;
    try {
      const t0 = Date.now();
      await until(async () => assert.equal(await client.set(ctx.k('after'), 'v'), 'OK'),
                  RECOVERY_TIMEOUT_MS, `${lib} SET after the restart (${e.target})`);
      const v = {
        get: await client.get(ctx.k('after')),
        before: await client.exists(ctx.k('before')), // the Redis kept no data across its restart
        name: await call(lib, client, ['CLIENT', 'GETNAME']),
        db: /\bdb=(\d+)/.exec(await call(lib, client, ['CLIENT', 'INFO']))[1],
      };
      await until(async () => {
        await client.publish(ctx.k('ch'), 'after-restart');
        await waitFor(() => e.heard.includes('after-restart'), 500, 'the message');
      }, RECOVERY_TIMEOUT_MS, `${lib} subscriber hears a message after the restart (${e.target})`);
      v.resubscribed = true;
      if (e.target === 'fencegate') {
        // The lock backend is the same Redis: once it is back, locks work again.
        const lock = `job-reconnect-${lib}-${RUN_ID}`;
        const token = await until(async () => {
          const t = await call(lib, client, ['FENCE.ACQUIRE', lock]);
          assert.ok(Number.isInteger(t) && t > 0, `FENCE.ACQUIRE returned ${short(t)}`);
          return t;
        }, RECOVERY_TIMEOUT_MS, `${lib} FENCE.ACQUIRE after the restart`);
        const fenced = await client.set(ctx.k('fenced'), 'x');
        assert.equal(fenced, 'OK', 'fenced SET after the restart');
        assert.equal(await call(lib, client, ['FENCE.RELEASE', lock]), 1);
        e.lockDetail = `lock token ${token}`;
      }
      e.recoveredMs = Date.now() - t0;
      results[`${lib}/${e.target}`] = { ok: true, value: normalize(v, ctx) };
    } catch (err) {
      results[`${lib}/${e.target}`] = { ok: false, error: errText(err) };
    }
  }));
  for (const e of entries) {
    try {
      await withTimeout(e.ctx.close(), 5000, 'closing');
    } catch (err) { /* best effort */ }
  }
  for (const lib of libs) {
    if (fail[lib]) {
      report(lib, 'reconnect', false, fail[lib]);
      continue;
    }
    const fg = results[`${lib}/fencegate`];
    const direct = results[`${lib}/direct`];
    const fgEntry = entries.find((x) => x.lib === lib && x.target === 'fencegate');
    if (!fg.ok) {
      report(lib, 'reconnect', false, `through fencegate: ${fg.error}` +
             (direct.ok ? ' (straight to Redis it recovered)' : ` (direct too: ${direct.error})`));
    } else if (!direct.ok) {
      report(lib, 'reconnect', false, `straight to Redis: ${direct.error}`);
    } else if (JSON.stringify(fg.value) !== JSON.stringify(direct.value)) {
      report(lib, 'reconnect', false, `results differ: through fencegate ${short(fg.value)}; ` +
             `straight to Redis ${short(direct.value)}`);
    } else {
      report(lib, 'reconnect', true, `recovered in ${fgEntry.recoveredMs} ms with db and name ` +
             `restored, ${fgEntry.lockDetail}: ${short(fg.value)}`);
    }
  }
}

// ---- main ---------------------------------------------------------------------------------------

async function main() {
  for (const [lib, scenarios] of [['ioredis', ioredisScenarios],
                                  ['node-redis', nodeRedisScenarios]]) {
    for (const [name, fn] of Object.entries(scenarios)) {
      await runScenario(lib, name, fn, { fgOnly: name === 'fence_lock' });
    }
  }
  await reconnectScenario();
}

main().then(() => {
  clearTimeout(watchdog);
  process.exit(failures ? 1 : 0);
}, (e) => {
  report('-', 'main', false, errText(e));
  process.exit(1);
});
