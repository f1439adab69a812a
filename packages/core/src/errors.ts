/** The error registry lives in the wire contract (@space/api); core re-exports it. */
export * from '@space/api/errors';
