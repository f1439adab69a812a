/**
 * @space/egress — the egress proxy and credential broker of SPACE: HTTP forward proxy and
 * CONNECT with TLS interception by a per-tenant CA, egress policies, secrets swapped in at the
 * point of use, an audit entry for every request.
 */
export { EgressProxy } from './proxy.js';
export type { EgressContext, EgressProxyOptions } from './proxy.js';
export { TenantCas } from './ca.js';
export { AddressRules, METADATA_ADDRESSES, Resolver, isSpecial } from './addresses.js';
