/**
 * @space/store-sql — the metadata store's queries, shared by `@space/store-sqlite` and
 * `@space/store-postgres`.
 */
export * from './store.js';
