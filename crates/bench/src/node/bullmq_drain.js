// inferq-dev bench: the BullMQ reference drain. Adds N jobs (in bulks of 1,000), waits for any AOF
// rewrite the adds set off, then times a Worker with CONCURRENCY slots, each job POSTing its
// payload to the gateway, until all N completed. Prints one JSON line, with the CPU seconds this
// node process and redis-server (INFO cpu) spent over the drain alone. BullMQ is loaded from
// $BULLMQ_DIR/node_modules/bullmq.
// Usage: node bullmq_drain.js REDIS_PORT GATEWAY_PORT N CONCURRENCY
'use strict';
const path = require('path');
const http = require('http');
const modules = path.join(process.env.BULLMQ_DIR || '.', 'node_modules');
const { Queue, Worker } = require(path.join(modules, 'bullmq'));
const IORedis = require(path.join(modules, 'ioredis'));

const [redisPort, gatewayPort, n, concurrency] = process.argv.slice(2, 6).map(Number);
const connection = { host: '127.0.0.1', port: redisPort, maxRetriesPerRequest: null };
const agent = new http.Agent({ keepAlive: true, maxSockets: concurrency });
const payload = { model: 'm', messages: [{ role: 'user', content: 'x'.repeat(200) }] };

function send(body) {
  return new Promise((resolve, reject) => {
    const req = http.request({
      host: '127.0.0.1', port: gatewayPort, path: '/v1/chat/completions', method: 'POST', agent,
      headers: { 'content-type': 'application/json' },
    }, (res) => {
      let text = '';
      res.on('data', (chunk) => { text += chunk; });
      res.on('end', () => resolve(text));
    });
    req.on('error', reject);
    req.end(JSON.stringify(body));
  });
}

// redis-server's user + system CPU seconds so far (INFO cpu), its finished children's (AOF
// rewrites) included, as the bench counts them for inferq's drains.
async function redisCpu(client) {
  const info = await client.info('cpu');
  const field = (name) => Number((info.match(new RegExp(`^${name}:([0-9.]+)`, 'm')) || [])[1]);
  return field('used_cpu_user') + field('used_cpu_sys')
    + field('used_cpu_user_children') + field('used_cpu_sys_children');
}

async function main() {
  const admin = new IORedis(connection);
  const queue = new Queue('inferq-bench', { connection });
  await queue.obliterate({ force: true }).catch(() => {});
  for (let start = 0; start < n; start += 1000) {
    const jobs = [];
    for (let i = start; i < Math.min(n, start + 1000); i++) {
      jobs.push({ name: 'request', data: { id: `r${i}`, payload }, opts: { jobId: `r${i}` } });
    }
    await queue.addBulk(jobs);
  }
  // An AOF rewrite the adds set off would run into the drain: wait for it, as the bench does
  // before inferq's drains.
  for (const started = Date.now(); Date.now() - started < 120000;) {
    const info = await admin.info('persistence');
    const busy = (name) => /^[1-9]/m.test((info.match(new RegExp(`^${name}:(.*)$`, 'm')) || [])[1] || '0');
    if (!busy('aof_rewrite_in_progress') && !busy('aof_rewrite_scheduled')) break;
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
  let completed = 0;
  let failed = 0;
  const redis0 = await redisCpu(admin);
  const cpu0 = process.cpuUsage();
  const t0 = process.hrtime.bigint();
  await new Promise((resolve) => {
    const worker = new Worker('inferq-bench', (job) => send(job.data.payload), { connection, concurrency });
    worker.on('completed', () => { completed += 1; if (completed === n) resolve(); });
    worker.on('failed', () => { failed += 1; });
  });
  const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
  const cpu = process.cpuUsage(cpu0);
  const node_cpu_s = (cpu.user + cpu.system) / 1e6;
  const redis_cpu_s = (await redisCpu(admin)) - redis0;
  console.log(JSON.stringify({
    system: 'bullmq', n, concurrency, seconds, jobs_per_s: n / seconds, failed, node_cpu_s, redis_cpu_s,
  }));
  process.exit(0);
}

main().catch((e) => { console.error(e); process.exit(1); });
