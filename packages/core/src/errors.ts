/** The error registry lives in the wire contract (@space/api); core re-exports it. */
export * from '@space/api/errors';

/** Node's socket error codes that mean a server cannot be reached now, not that it refused. */
const UNREACHABLE_CODES = new Set(['ECONNREFUSED', 'ECONNRESET', 'ETIMEDOUT', 'EHOSTUNREACH', 'ENETUNREACH', 'ENOTFOUND', 'EAI_AGAIN', 'EPIPE']);

/**
 * Whether `err` is Node failing to reach a server (refused, reset, timed out, no route, no
 * name): what the clients of external stores turn into their `…_UNAVAILABLE` codes.
 *
 * @example isUnreachableError(Object.assign(new Error('connect ECONNREFUSED'), { code: 'ECONNREFUSED' })) // true
 */
export function isUnreachableError(err: unknown): boolean {
  return UNREACHABLE_CODES.has((err as { code?: string } | undefined)?.code ?? '');
}
