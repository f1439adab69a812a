/**
 * @space/ingress — preview URLs for a sandbox's ports: `PORT-SANDBOXID.DOMAIN` routed to that
 * port inside the sandbox, private by default (an access token, or a signed expiring link that
 * sets a cookie), WebSockets and streams included, every request audited.
 *
 * @example
 * import { IngressServer } from '@space/ingress';
 * const ingress = new IngressServer({ domain: 'localhost:7072', secret, backend });
 * await ingress.listen('127.0.0.1', 7072);
 */
export { IngressServer } from './server.js';
export type { IngressBackend, IngressLogEntry, IngressRoute, IngressServerOptions } from './server.js';
export { SandboxSlots } from './slots.js';
export type { SlotLimits } from './slots.js';
export { ingressHost, isPort, localNamesResolve, parseIngressHost } from './host.js';
export type { IngressAddress } from './host.js';
export { ACCESS_TOKEN_HEADER, E2B_ACCESS_TOKEN_HEADER, PASS_COOKIE, SIGNED_LINK_PATH, checkPass, cookieValue, hashToken, makePass, tokenMatches, withoutCookie } from './access.js';
export type { PassSubject } from './access.js';
