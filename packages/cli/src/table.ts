/** Column-aligned text tables, as the CLI prints listings. */

/**
 * The rows as aligned columns, the first row being the header.
 * @example table([['ID', 'STATE'], ['sb1', 'running']])
 */
export function table(rows: string[][]): string {
  const w = rows[0]!.map((_, i) => Math.max(...rows.map((r) => (r[i] ?? '').length)));
  return rows.map((r) => r.map((c, i) => c.padEnd(w[i]!)).join('  ').trimEnd()).join('\n');
}
