// inferq-dev bench: a stand-in OpenAI-style gateway in node, the one BullMQ and inferq are both
// measured against. Every POST gets the same small chat-completion body at once; GET /count
// says how many POSTs were served, GET /connections how many TCP connections were accepted
// (a client that keeps its connections alive opens about as many as its concurrency).
// Usage: node gateway.js PORT
'use strict';
const http = require('http');
const port = Number(process.argv[2]) || 18000;
const answer = JSON.stringify({
  id: 'bench', object: 'chat.completion',
  choices: [{ index: 0, message: { role: 'assistant', content: 'ok' }, finish_reason: 'stop' }],
  usage: { prompt_tokens: 5, completion_tokens: 1, total_tokens: 6 },
});
let served = 0;
let connections = 0;
const server = http.createServer((req, res) => {
  if (req.method === 'GET' && req.url === '/count') {
    res.end(String(served));
    return;
  }
  if (req.method === 'GET' && req.url === '/connections') {
    res.end(String(connections));
    return;
  }
  req.resume();
  req.on('end', () => {
    served += 1;
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(answer);
  });
});
server.on('connection', () => { connections += 1; });
server.listen(port, '127.0.0.1');
