/**
 * The directory of the built console (index.html and assets/), which spaced serves at `/`.
 *
 * @example
 * import { consoleDir } from '@space/console';
 * readFileSync(path.join(consoleDir, 'index.html'));
 */
export declare const consoleDir: string;
