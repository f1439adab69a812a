/**
 * @space/e2b — an E2B-compatible API over SPACE's core: agents written against E2B's SDK run
 * on SPACE by setting `E2B_API_URL`, `E2B_SANDBOX_URL` and `E2B_API_KEY`. See docs/e2b.md.
 */
export { buildE2bApp } from './app.js';
export type { E2bAppDeps } from './app.js';
export { AccessTokens, SignedFileOwners, type SignedCandidate, type SignedCandidateSource, type SignedFileQuery } from './access.js';
export { ENVD_VERSION } from './control.js';
