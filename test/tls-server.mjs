// A real HTTPS (and HTTP) server on loopback with a CA of its own, for egress tests and
// benchmarks: it records every request (method, path, headers, body size), answers with its
// method, path and body size as JSON, serves GET /bytes/N as N bytes and /redirect as a 302.
import 'reflect-metadata';
import * as x509 from '@peculiar/x509';
import { webcrypto } from 'node:crypto';
import http from 'node:http';
import https from 'node:https';

x509.cryptoProvider.set(webcrypto);
const ALG = { name: 'ECDSA', namedCurve: 'P-256', hash: 'SHA-256' };
const pem = (label, der) => `-----BEGIN ${label}-----\n${Buffer.from(der).toString('base64').replace(/.{64}/g, '$&\n').replace(/\n?$/, '\n')}-----END ${label}-----\n`;

/** A CA and a server certificate for `names` (DNS names) signed by it. */
export async function makePki(names) {
  const caKeys = await webcrypto.subtle.generateKey(ALG, true, ['sign', 'verify']);
  const ca = await x509.X509CertificateGenerator.createSelfSigned({
    serialNumber: '01', name: 'CN=SPACE test upstream CA', notBefore: new Date(Date.now() - 86_400_000), notAfter: new Date(Date.now() + 30 * 86_400_000), signingAlgorithm: ALG, keys: caKeys,
    extensions: [new x509.BasicConstraintsExtension(true, 0, true), new x509.KeyUsagesExtension(x509.KeyUsageFlags.keyCertSign, true), await x509.SubjectKeyIdentifierExtension.create(caKeys.publicKey)],
  });
  const keys = await webcrypto.subtle.generateKey(ALG, true, ['sign', 'verify']);
  const cert = await x509.X509CertificateGenerator.create({
    serialNumber: '02', subject: `CN=${names[0]}`, issuer: ca.subject, notBefore: new Date(Date.now() - 86_400_000), notAfter: new Date(Date.now() + 30 * 86_400_000), signingAlgorithm: ALG, publicKey: keys.publicKey, signingKey: caKeys.privateKey,
    extensions: [new x509.SubjectAlternativeNameExtension(names.map((value) => ({ type: 'dns', value }))), new x509.ExtendedKeyUsageExtension([x509.ExtendedKeyUsage.serverAuth]), await x509.AuthorityKeyIdentifierExtension.create(ca)],
  });
  return { caPem: ca.toString('pem') + '\n', certPem: cert.toString('pem') + '\n', keyPem: pem('PRIVATE KEY', await webcrypto.subtle.exportKey('pkcs8', keys.privateKey)) };
}

function handler(seen) {
  return (req, res) => {
    let size = 0;
    req.on('data', (d) => (size += d.length));
    req.on('end', () => {
      seen.push({ method: req.method, url: req.url, headers: req.headers, size });
      const m = /^\/bytes\/(\d+)$/.exec(req.url ?? '');
      if (m) {
        let left = Number(m[1]);
        res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': left });
        const chunk = Buffer.alloc(64 * 1024, 7);
        const pump = () => {
          while (left > 0) {
            const n = Math.min(left, chunk.length);
            left -= n;
            if (!res.write(n === chunk.length ? chunk : chunk.subarray(0, n))) return void res.once('drain', pump);
          }
          res.end();
        };
        return pump();
      }
      if (req.url === '/redirect') {
        res.writeHead(302, { location: 'http://169.254.169.254/latest/meta-data/' });
        return res.end();
      }
      // Never echo the request's headers: a real API does not send credentials back, and the
      // tests check that no byte of them ends up inside the sandbox.
      res.setHeader('content-type', 'application/json');
      res.end(JSON.stringify({ method: req.method, url: req.url, size }));
    });
  };
}

/**
 * Starts an HTTPS and an HTTP server on `address` (127.0.0.1; random ports unless given) for
 * `names`. `seen` collects every request they received.
 */
export async function startUpstream(names = ['api.example.test', 'other.example.test'], { address = '127.0.0.1', httpsPort = 0, httpPort = 0 } = {}) {
  const pki = await makePki(names);
  const seen = [];
  const tlsServer = https.createServer({ key: pki.keyPem, cert: pki.certPem }, handler(seen));
  const plain = http.createServer(handler(seen));
  await Promise.all([[tlsServer, httpsPort], [plain, httpPort]].map(([s, port]) => new Promise((r, j) => s.once('error', j).listen(port, address, r))));
  return {
    ...pki,
    seen,
    httpsPort: tlsServer.address().port,
    httpPort: plain.address().port,
    close: () => Promise.all([tlsServer, plain].map((s) => new Promise((r) => { s.closeAllConnections(); s.close(r); }))),
  };
}
