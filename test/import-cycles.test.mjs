// The house stays in order: no module of packages/*/src imports itself through others.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';
import { importCycles } from '../scripts/check-import-cycles.mjs';

const root = fileURLToPath(new URL('..', import.meta.url));

describe('import cycles', () => {
  it('the packages have none', async () => {
    const cycles = await importCycles(['packages/*/src/**/*.ts'], root);
    assert.deepEqual(cycles.map((c) => c.join(' -> ')), []);
  });

  it('the check finds one when it is introduced (a type-only import counts)', async () => {
    const dir = mkdtempSync('/tmp/space-cycle-');
    try {
      // Resolved as the packages are, through a tsconfig (imports name ./x.js for ./x.ts).
      writeFileSync(`${dir}/tsconfig.json`, JSON.stringify({ compilerOptions: { module: 'nodenext', moduleResolution: 'nodenext' } }));
      writeFileSync(`${dir}/a.ts`, "import type { B } from './b.js';\nexport interface A { b?: B }\n");
      writeFileSync(`${dir}/b.ts`, "import { c } from './c.js';\nexport interface B { n: number }\nexport const d = c;\n");
      writeFileSync(`${dir}/c.ts`, "import type { A } from './a.js';\nexport const c = 1;\nexport type CA = A;\n");
      const cycles = await importCycles(['*.ts'], dir);
      assert.equal(cycles.length, 1);
      assert.deepEqual([...cycles[0]].sort(), ['a.ts', 'b.ts', 'c.ts']);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
