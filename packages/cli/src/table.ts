/** Column-aligned text tables, as the CLI prints listings, and the sizes in them. */

/**
 * A size in MiB as a listing shows it.
 * @example mib(512) // '512 MiB'; mib(1536) // '1.5 GiB'
 */
export function mib(n: number): string {
  return n >= 1024 ? `${+(n / 1024).toFixed(1)} GiB` : `${n} MiB`;
}

/**
 * The rows as aligned columns, the first row being the header.
 * @example table([['ID', 'STATE'], ['sb1', 'running']])
 */
export function table(rows: string[][]): string {
  const w = rows[0]!.map((_, i) => Math.max(...rows.map((r) => (r[i] ?? '').length)));
  return rows.map((r) => r.map((c, i) => c.padEnd(w[i]!)).join('  ').trimEnd()).join('\n');
}
