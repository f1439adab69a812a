// The house stays in order: no module of packages/*/src imports itself through others.
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';
import { importCycles, layerViolations } from '../scripts/check-import-cycles.mjs';

const root = fileURLToPath(new URL('..', import.meta.url));

describe('import cycles', () => {
  it('the packages have none', async () => {
    const cycles = await importCycles(['packages/*/src/**/*.ts'], root);
    assert.deepEqual(cycles.map((c) => c.join(' -> ')), []);
  });

  it("core's folders import one way (ports <- security <- storage <- … <- sandboxes)", async () => {
    assert.deepEqual(await layerViolations(['packages/core/src/**/*.ts'], root), []);
  });

  it('the layer check finds an import pointing the wrong way', async () => {
    const dir = mkdtempSync('/tmp/space-layers-');
    try {
      writeFileSync(`${dir}/tsconfig.json`, JSON.stringify({ compilerOptions: { module: 'nodenext', moduleResolution: 'nodenext' } }));
      mkdirSync(`${dir}/packages/core/src/ports`, { recursive: true });
      mkdirSync(`${dir}/packages/core/src/sandboxes`, { recursive: true });
      writeFileSync(`${dir}/packages/core/src/model.ts`, 'export const m = 1;\n');
      writeFileSync(`${dir}/packages/core/src/sandboxes/live.ts`, "import { m } from '../model.js';\nexport const l = m;\n");
      writeFileSync(`${dir}/packages/core/src/ports/driver.ts`, "import type { l } from '../sandboxes/live.js';\nexport type D = typeof l;\n");
      assert.deepEqual(await layerViolations(['packages/core/src/**/*.ts'], dir), ['packages/core/src/ports/driver.ts -> packages/core/src/sandboxes/live.ts']);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
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
