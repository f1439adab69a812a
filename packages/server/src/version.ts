/** The SPACE release, from this package's package.json. */
import { readFileSync } from 'node:fs';

/** Release version of the daemon, e.g. "0.1.0". */
export const VERSION: string = (JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8')) as { version: string }).version;
