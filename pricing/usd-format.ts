// USD as text: for headers (machine-read, plain decimals) and for messages (person-read, $1.84).

/** Plain decimal without exponent or trailing zeros: 0.000123 → "0.000123", 2 → "2". */
function plain(usd: number, decimals: number): string {
  const s = usd.toFixed(decimals);
  return s.includes('.') ? s.replace(/0+$/, '').replace(/\.$/, '') : s;
}

/**
 * `x-tollgate-cost-usd` (SPEC §11): a plain decimal with up to 10 decimals — the ledger's own
 * precision (`roundUsd`), so the header is the figure the ledger, the spend views and a stream's
 * closing comment hold — `0` for free, and null (header absent) when the cost is unknown. A
 * non-zero cost too small for 10 decimals keeps more rather than claiming to be free.
 */
export function formatUsdHeader(usd: number | null): string | null {
  if (usd === null || !Number.isFinite(usd)) return null;
  if (usd === 0) return '0';
  const s = plain(usd, 10);
  return s === '0' || s === '-0' ? plain(usd, 14) : s;
}

/**
 * A figure in a notice header (`estimate_usd=0.84`): cents, or two significant digits below a
 * cent so a small figure is never shown as 0.
 */
export function formatUsdFigure(usd: number): string {
  if (usd === 0) return '0';
  if (Math.abs(usd) >= 0.01) return usd.toFixed(2);
  return plain(Number(usd.toPrecision(2)), 12);
}

/** A figure in a message a person reads: `$1.84`, `$2.00`, `$0.0031`. */
export function formatUsdText(usd: number): string {
  if (usd === 0) return '$0.00';
  return `$${formatUsdFigure(usd)}`;
}
