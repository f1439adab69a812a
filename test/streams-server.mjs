// A test server for a sandbox, on port 8080: WebSocket echo (/ws), an event stream (/events, ended by
// /release), uploads hashed and kept (POST /upload), the last upload (/download), N bytes
// (/bytes/N) and a short answer (/). Used by the ingress tests and its benchmark.
import { build } from 'esbuild';

/** The program: Node 18 (the `base` template's `nodejs`), `ws` bundled in. */
const STREAMS_SERVER = `
const http = require('node:http');
const fs = require('node:fs');
const { createHash } = require('node:crypto');
const { WebSocketServer } = require('ws');
let release;
const server = http.createServer((req, res) => {
  if (req.url === '/events') {
    res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-store' });
    res.write('data: first\\n\\n');
    release = () => res.end('data: last\\n\\n');
  } else if (req.url === '/release') {
    release?.();
    res.end('released');
  } else if (req.url === '/upload' && req.method === 'POST') {
    const h = createHash('sha256');
    let size = 0;
    const out = fs.createWriteStream('/tmp/upload.bin');
    req.on('data', (d) => { h.update(d); size += d.length; });
    req.pipe(out);
    out.on('finish', () => res.end(JSON.stringify({ size, sha256: h.digest('hex') })));
  } else if (req.url.startsWith('/bytes/')) {
    let left = Number(req.url.slice(7));
    res.writeHead(200, { 'content-length': left });
    const block = Buffer.alloc(1 << 20, 'abcdefgh');
    const more = () => {
      while (left > 0) {
        const n = Math.min(left, block.length);
        left -= n;
        if (!res.write(n === block.length ? block : block.subarray(0, n))) return void res.once('drain', more);
      }
      res.end();
    };
    more();
  } else if (req.url === '/download') {
    res.writeHead(200, { 'content-length': fs.statSync('/tmp/upload.bin').size });
    fs.createReadStream('/tmp/upload.bin').pipe(res);
  } else res.end('streams server');
});
new WebSocketServer({ server, path: '/ws' }).on('connection', (ws) => ws.on('message', (m, binary) => ws.send(m, { binary })));
// On the host (a benchmark's stand-in for the sandbox): STREAMS_PORT=0 picks a port and prints it.
server.listen(Number(process.env.STREAMS_PORT || 8080), process.env.STREAMS_HOST || '0.0.0.0', () => process.env.STREAMS_PORT && console.log(server.address().port));
`;

/** The server as one CommonJS program (`ws` bundled in): `node -e` runs it too. */
export async function streamsServerProgram() {
  const bundle = await build({ stdin: { contents: STREAMS_SERVER, resolveDir: new URL('..', import.meta.url).pathname }, bundle: true, platform: 'node', target: 'node18', format: 'cjs', write: false, logLevel: 'silent' });
  return bundle.outputFiles[0].text;
}

/**
 * Starts the server in `sandbox` (template `base`) in the background; resolves once it is
 * written and launched (poll the port for readiness).
 */
export async function startStreamsServer(sandbox) {
  await sandbox.files.write('/tmp/streams.js', await streamsServerProgram());
  await sandbox.commands.run('node /tmp/streams.js', { background: true });
}
