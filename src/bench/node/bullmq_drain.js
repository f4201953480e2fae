// inferq bench: the BullMQ reference drain. Adds N jobs (in bulks of 1,000), then times a
// Worker with CONCURRENCY slots, each job POSTing its payload to the gateway, until all N
// completed. Prints one JSON line. BullMQ is loaded from $BULLMQ_DIR/node_modules/bullmq.
// Usage: node bullmq_drain.js REDIS_PORT GATEWAY_PORT N CONCURRENCY
'use strict';
const path = require('path');
const http = require('http');
const { Queue, Worker } = require(path.join(process.env.BULLMQ_DIR || '.', 'node_modules', 'bullmq'));

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

async function main() {
  const queue = new Queue('inferq-bench', { connection });
  await queue.obliterate({ force: true }).catch(() => {});
  for (let start = 0; start < n; start += 1000) {
    const jobs = [];
    for (let i = start; i < Math.min(n, start + 1000); i++) {
      jobs.push({ name: 'request', data: { id: `r${i}`, payload }, opts: { jobId: `r${i}` } });
    }
    await queue.addBulk(jobs);
  }
  let completed = 0;
  let failed = 0;
  const t0 = process.hrtime.bigint();
  await new Promise((resolve) => {
    const worker = new Worker('inferq-bench', (job) => send(job.data.payload), { connection, concurrency });
    worker.on('completed', () => { completed += 1; if (completed === n) resolve(); });
    worker.on('failed', () => { failed += 1; });
  });
  const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
  console.log(JSON.stringify({ system: 'bullmq', n, concurrency, seconds, jobs_per_s: n / seconds, failed }));
  process.exit(0);
}

main().catch((e) => { console.error(e); process.exit(1); });
