/**
 * What core logs through: pino's shape, so the daemon passes its pino logger as is. At the
 * bottom of core: imports nothing.
 *
 * @example
 * const quiet: Logger = { info() {}, warn() {}, error() {}, debug() {} };
 */
export interface Logger {
  info(obj: object, msg?: string): void;
  warn(obj: object, msg?: string): void;
  error(obj: object, msg?: string): void;
  debug(obj: object, msg?: string): void;
}
