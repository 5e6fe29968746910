// Benchmark peers in Node.js, speaking what `clarion bench` speaks: WebSocket subscribers on
// /ws?topic=T, and Clarion's publish batch (POST /publish, {"messages":[{"topic","data"}]}) on a
// separate API port, each message's data sent verbatim as one text message to every subscriber
// of its topic, in order.
//
//   node bench/peers/node_server.js ws|socketio|uws PORT API_PORT
//
// Modules come from bench/peers/.env/node_modules (bench/peers/setup.sh).
'use strict';
const path = require('path');
const http = require('http');
const mods = path.join(__dirname, '.env', 'node_modules');
const need = (name) => require(path.join(mods, name));

const [mode, portArg, apiArg] = process.argv.slice(2);
const port = Number(portArg);
const apiPort = Number(apiArg);

// The API: a plain Node HTTP server, the same for every peer (it is not what is measured:
// one keep-alive connection, one request per batch).
function serveApi(publish) {
  const api = http.createServer((req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => {
      let status = 200;
      let answer = 'ok';
      try {
        const batch = JSON.parse(Buffer.concat(chunks).toString('utf8'));
        for (const m of batch.messages || []) publish(String(m.topic), String(m.data));
      } catch (e) {
        status = 400;
        answer = String(e);
      }
      res.writeHead(status, { 'Content-Type': 'text/plain', 'Content-Length': Buffer.byteLength(answer) });
      res.end(answer);
    });
  });
  api.keepAliveTimeout = 0;
  api.listen(apiPort, '127.0.0.1');
  return api;
}

function topicOf(url) {
  const q = new URL(url, 'http://x');
  return q.pathname === '/ws' ? q.searchParams.get('topic') : null;
}

function ready() {
  console.log(`ready ${port}`);
}

if (mode === 'ws') {
  // Node `ws`: a Set of sockets per topic, one send() per subscriber.
  const { WebSocketServer } = need('ws');
  const topics = new Map();
  const wss = new WebSocketServer({ noServer: true, perMessageDeflate: false });
  const server = http.createServer((req, res) => { res.writeHead(404); res.end(); });
  server.on('upgrade', (req, socket, head) => {
    const topic = topicOf(req.url);
    if (topic === null) { socket.destroy(); return; }
    wss.handleUpgrade(req, socket, head, (ws) => {
      let subs = topics.get(topic);
      if (!subs) topics.set(topic, (subs = new Set()));
      subs.add(ws);
      ws.on('close', () => subs.delete(ws));
      ws.on('error', () => {});
    });
  });
  serveApi((topic, data) => {
    const subs = topics.get(topic);
    if (subs) for (const ws of subs) ws.send(data);
  });
  server.listen(port, '127.0.0.1', ready);
} else if (mode === 'socketio') {
  // Socket.IO over its websocket transport only. `clarion bench` is a plain WebSocket client,
  // so this adapter does the two things a Socket.IO client would: the URL is rewritten to
  // Engine.IO's (/socket.io/?EIO=4&transport=websocket), and the namespace CONNECT packet a
  // client sends first ("40" on the wire: Engine.IO message 4 holding Socket.IO CONNECT 0) is
  // fed to the server on its behalf. Every delivery is
  // then a real Socket.IO event frame, 42["m","DATA"], which the bench unwraps. Engine.IO's
  // heartbeat is stretched to 10 minutes because the bench does not answer Engine.IO pings.
  const { Server } = need('socket.io');
  const server = http.createServer((req, res) => { res.writeHead(404); res.end(); });
  const io = new Server({ connectTimeout: 600000, serveClient: false });
  // The Engine.IO server Socket.IO would create when attached, bound without its own upgrade
  // listener so that this adapter's can rewrite the URL first.
  const engine = new (need('engine.io').Server)({
    transports: ['websocket'],
    perMessageDeflate: false,
    pingInterval: 600000,
    pingTimeout: 600000,
  });
  io.bind(engine);
  io.on('connection', (socket) => {
    const topic = socket.handshake.query.topic;
    if (typeof topic === 'string') socket.join(topic);
  });
  engine.on('connection', (raw) => {
    raw.onPacket({ type: 'message', data: '0' });
  });
  server.on('upgrade', (req, socket, head) => {
    const topic = topicOf(req.url);
    if (topic === null) { socket.destroy(); return; }
    req.url = `/socket.io/?EIO=4&transport=websocket&topic=${encodeURIComponent(topic)}`;
    engine.handleUpgrade(req, socket, head);
  });
  serveApi((topic, data) => io.to(topic).emit('m', data));
  server.listen(port, '127.0.0.1', ready);
} else if (mode === 'uws') {
  // µWebSockets (uWebSockets.js binaries from npm `uwebsockets`): its own topic tree.
  const uWS = need('uwebsockets');
  const app = uWS.App();
  app.ws('/ws', {
    compression: uWS.DISABLED,
    idleTimeout: 0,
    maxBackpressure: 64 * 1024 * 1024,
    upgrade: (res, req, context) => {
      const topic = new URLSearchParams(req.getQuery() || '').get('topic') || '';
      res.upgrade({ topic }, req.getHeader('sec-websocket-key'),
        req.getHeader('sec-websocket-protocol'), req.getHeader('sec-websocket-extensions'), context);
    },
    open: (ws) => { ws.subscribe(ws.getUserData().topic); },
  });
  app.listen('127.0.0.1', port, (token) => {
    if (!token) { console.error(`cannot listen on ${port}`); process.exit(1); }
    ready();
  });
  serveApi((topic, data) => app.publish(topic, data, false));
} else {
  console.error('usage: node_server.js ws|socketio|uws PORT API_PORT');
  process.exit(2);
}
