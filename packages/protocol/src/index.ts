/**
 * @space/protocol — the only code shared by the SPACE daemon and the in-sandbox agent:
 * frame codec, flow-control constants and message shapes.
 */
export * from './frame.js';
export * from './messages.js';
