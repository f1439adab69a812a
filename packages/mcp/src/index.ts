/**
 * @space/mcp — SPACE as a Model Context Protocol server (`space mcp`): sandboxes, commands,
 * files, snapshots, rollback and forks as MCP tools; sandboxes and snapshot timelines as
 * resources. See docs/mcp.md.
 */
export { createMcpServer, serveHttp, serveStdio, SERVER_INFO } from './server.js';
export type { HttpMcp, HttpOptions } from './server.js';
export { registerTools, toolError, capped, OUTPUT_CAP_BYTES, READ_CAP_BYTES } from './tools.js';
