/**
 * A small QMP client: QEMU's JSON control protocol over the VM's unix socket. One connection
 * per operation (QMP serves one client at a time, and a daemon restart must find nothing
 * half-open); events are skipped.
 */
import net from 'node:net';
import { SpaceError } from '@space/core';

/**
 * Runs QMP commands in order on one connection and closes it.
 *
 * @example
 * const [status] = await qmp('/var/lib/space/microvm/boxes/sb1/qmp.sock', [{ execute: 'query-status' }]);
 */
export function qmp(socketPath: string, commands: { execute: string; arguments?: object }[], timeoutMs = 30_000): Promise<unknown[]> {
  return new Promise((resolve, reject) => {
    const sock = net.connect(socketPath);
    const results: unknown[] = [];
    let buf = '';
    let greeted = false;
    let sent = 0;
    const timer = setTimeout(() => fail(new SpaceError('DRIVER_FAILED', `QEMU did not answer ${commands[sent - 2]?.execute ?? 'the QMP greeting'} within ${timeoutMs} ms`)), timeoutMs);
    const fail = (err: Error) => {
      clearTimeout(timer);
      sock.destroy();
      reject(err);
    };
    const next = () => {
      const c = sent === 0 ? { execute: 'qmp_capabilities' } : commands[sent - 1];
      if (!c) {
        clearTimeout(timer);
        sock.end();
        resolve(results);
        return;
      }
      sent++;
      sock.write(JSON.stringify(c) + '\n');
    };
    sock.on('error', (err) => fail(new SpaceError('DRIVER_FAILED', `Cannot reach QEMU's control socket ${socketPath}: ${err.message}`, { cause: err })));
    sock.on('data', (d) => {
      buf += d.toString();
      let nl: number;
      while ((nl = buf.indexOf('\n')) >= 0) {
        const line = buf.slice(0, nl).trim();
        buf = buf.slice(nl + 1);
        if (!line) continue;
        let msg: { QMP?: unknown; return?: unknown; error?: { class?: string; desc?: string }; event?: string };
        try {
          msg = JSON.parse(line) as typeof msg;
        } catch {
          return fail(new SpaceError('DRIVER_FAILED', `QEMU sent a malformed QMP line: ${line.slice(0, 200)}`));
        }
        if (msg.event) continue;
        if (!greeted) {
          if (!msg.QMP) return fail(new SpaceError('DRIVER_FAILED', 'QEMU sent no QMP greeting'));
          greeted = true;
          next();
          continue;
        }
        if (msg.error) return fail(new SpaceError('DRIVER_FAILED', `QEMU refused ${commands[sent - 2]?.execute ?? 'qmp_capabilities'}: ${msg.error.desc ?? msg.error.class}`));
        if (sent > 1) results.push(msg.return);
        next();
      }
    });
  });
}
