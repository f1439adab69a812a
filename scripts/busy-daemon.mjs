#!/usr/bin/env node
// A busy daemon beside the suite (issue 18's load runs): two `minimal` sandboxes created, a
// command run in each, both killed, in a loop, through the SDK; a line every 100 sandboxes.
//   space up && node scripts/busy-daemon.mjs &     # then run ./space test from a clean clone
// Connects like the CLI: SPACE_URL (default http://127.0.0.1:7070) and SPACE_API_KEY (default
// the key file of the default data directory).
import { readFileSync } from 'node:fs';
import { Sandbox } from '../packages/sdk/dist/index.js';

const conn = { apiUrl: process.env.SPACE_URL ?? 'http://127.0.0.1:7070', apiKey: process.env.SPACE_API_KEY ?? readFileSync('/var/lib/space/admin.key', 'utf8').trim() };
let n = 0;
let errors = 0;
for (;;) {
  try {
    await Promise.all(
      [0, 1].map(async () => {
        const sb = await Sandbox.create({ ...conn, template: 'minimal' });
        await sb.commands.run(['true']);
        await sb.kill();
      }),
    );
    n += 2;
  } catch (e) {
    errors++;
    console.error(new Date().toISOString(), e.code, e.message);
    await new Promise((r) => setTimeout(r, 1000));
  }
  if (n % 100 === 0) console.log(new Date().toISOString(), 'sandboxes', n, 'errors', errors);
}
