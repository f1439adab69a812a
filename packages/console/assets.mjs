// Where the console's built assets are (dist/, written by build.mjs at build time) — what spaced
// serves at / and /console/.
import { fileURLToPath } from 'node:url';

/** The directory of the built console: index.html and assets/. */
export const consoleDir = fileURLToPath(new URL('./dist/', import.meta.url));
