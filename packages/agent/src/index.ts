/**
 * @space/agent — the in-sandbox agent. Its entry point is `main.ts`, bundled by `build.mjs`
 * into `dist/agent.cjs`; this module only tells drivers where that bundle is.
 */
import { fileURLToPath } from 'node:url';

/** Absolute path of the bundled agent (`dist/agent.cjs`). */
export const AGENT_BUNDLE = fileURLToPath(new URL('./agent.cjs', import.meta.url));

/** Absolute path of the static helper (`dist/space-helper`): sethostname, and exec without CAP_SYS_ADMIN. */
export const AGENT_HELPER = fileURLToPath(new URL('./space-helper', import.meta.url));

/**
 * Absolute path of the compatibility shim (`dist/libspace-compat.so`), which the gVisor driver
 * preloads into every dynamically linked program of a sandbox (see `native/compat.c`).
 */
export const AGENT_COMPAT_LIB = fileURLToPath(new URL('./libspace-compat.so', import.meta.url));
