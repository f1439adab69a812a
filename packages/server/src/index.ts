/**
 * @space/server — `spaced`, the SPACE daemon: HTTP API over the core service.
 */
export { startDaemon, readState, defaultDataDir, defaultWorkDir, parseListen, templateImagesDir } from './daemon.js';
export type { Daemon, DaemonOptions, DaemonState } from './daemon.js';
export { buildApp } from './app.js';
export type { AppDeps } from './app.js';
export { VERSION } from './version.js';
