// Tool-call markup that models write into plain text when their server does not parse it (or when
// no tools were offered, as in a final turn): Hermes/Qwen `<tool_call>`, Phi-4 and Granite
// `<|tool_call|>`, Kimi's and DeepSeek's call sections, Mistral's `[TOOL_CALLS]`, Llama 3.1's
// `<|python_tag|>`, Llama 3.2's `<function=…>`, Llama 4's `<|python_start|>` and gpt-oss's harmony
// messages to a function. A final turn must not show any of it (seed 001). A bare JSON object or a
// fenced code block may be a call too, but as often an answer: those are left alone.

interface Marker {
  open: string;
  /** null: the markup runs to the end of the text (the format has no closing tag). */
  close: string | null;
}

const MARKERS: readonly Marker[] = [
  { open: '<tool_call>', close: '</tool_call>' },
  { open: '<|tool_call|>', close: '<|/tool_call|>' },
  { open: '<|tool_calls_section_begin|>', close: '<|tool_calls_section_end|>' },
  { open: '<｜tool▁calls▁begin｜>', close: '<｜tool▁calls▁end｜>' },
  { open: '<function=', close: '</function>' },
  { open: '[TOOL_CALLS]', close: null },
  { open: '<|python_tag|>', close: null },
  // Llama 4.
  { open: '<|python_start|>', close: '<|python_end|>' },
  // gpt-oss (harmony): a message to a function, its recipient named in the header's role part or
  // its channel part; the whole message, header and all, ends with `<|call|>`.
  { open: '<|start|>assistant to=', close: '<|call|>' },
  { open: '<|start|>assistant<|channel|>commentary to=', close: '<|call|>' },
  { open: '<|start|>assistant<|channel|>analysis to=', close: '<|call|>' },
  { open: '<|channel|>commentary to=', close: '<|call|>' },
  { open: '<|channel|>analysis to=', close: '<|call|>' },
];

const LONGEST_OPEN = Math.max(...MARKERS.map((m) => m.open.length));

/**
 * Removes tool-call markup from text that arrives in pieces. Outside markup it holds back only a
 * tail that could be the start of an opening tag (`<tool_c`), so text keeps streaming; inside
 * markup it keeps only a tail that could be the start of the closing tag, so memory stays bounded.
 * An opening tag never closed is dropped to the end of the text.
 */
export class MarkupStripper {
  private pending = '';
  private inside: Marker | null = null;
  /** True once any markup was found (and removed). */
  found = false;

  /** Feeds a piece of text; returns what can be shown now. */
  push(text: string): string {
    let s = this.pending + text;
    this.pending = '';
    let out = '';
    while (s.length > 0) {
      if (this.inside !== null) {
        const close = this.inside.close;
        if (close === null) return out; // runs to the end: drop everything from here on
        const at = s.indexOf(close);
        if (at < 0) {
          this.pending = s.slice(Math.max(0, s.length - (close.length - 1)));
          return out;
        }
        s = s.slice(at + close.length);
        this.inside = null;
        continue;
      }
      const hit = earliestOpen(s);
      if (hit === null) {
        const hold = partialOpenLength(s);
        this.pending = s.slice(s.length - hold);
        return out + s.slice(0, s.length - hold);
      }
      out += s.slice(0, hit.at);
      s = s.slice(hit.at + hit.marker.open.length);
      this.inside = hit.marker;
      this.found = true;
    }
    return out;
  }

  /** The text is complete: returns what was held back as a possible tag start. */
  finish(): string {
    // An unclosed markup block is dropped; a held tail that never became a tag is ordinary text.
    const rest = this.inside === null ? this.pending : '';
    this.pending = '';
    return rest;
  }
}

/** Whole-text form of `MarkupStripper`. */
export function stripMarkup(text: string): { text: string; found: boolean } {
  const s = new MarkupStripper();
  const out = s.push(text) + s.finish();
  return { text: out, found: s.found };
}

/** Every tag of the markup, opening and closing, longest first (`<|start|>assistant…` before `<|channel|>…`). */
const TAGS = [...new Set(MARKERS.flatMap((m) => (m.close === null ? [m.open] : [m.open, m.close])))].sort((a, b) => b.length - a.length);

/**
 * Text that quotes markup (a tool's result that holds a web page with `<tool_call>` in it) made
 * inert, not cut: each tag's first character becomes a look-alike (`‹tool_call>`, `［TOOL_CALLS]`),
 * so a client that parses calls out of text finds none, and a person still reads what was there.
 */
export function defangMarkup(text: string): string {
  let out = text;
  for (const tag of TAGS) {
    if (out.includes(tag)) out = out.replaceAll(tag, (tag[0] === '[' ? '［' : '‹') + tag.slice(1));
  }
  return out;
}

/** The markup of a whole text, each call block from its opening tag to its closing one (or the end). */
export function markupSpans(text: string): string[] {
  const spans: string[] = [];
  let s = text;
  for (let hit = earliestOpen(s); hit !== null; hit = earliestOpen(s)) {
    const rest = s.slice(hit.at);
    const { open, close } = hit.marker;
    const end = close === null ? -1 : rest.indexOf(close, open.length);
    const stop = end < 0 ? rest.length : end + close!.length;
    spans.push(rest.slice(0, stop));
    s = rest.slice(stop);
  }
  return spans;
}

/**
 * The tools a block of markup calls, as far as its dialect names them: `<function=NAME>`, harmony's
 * `to=functions.NAME`, Kimi's `functions.NAME:0`, DeepSeek's `<｜tool▁sep｜>NAME`, the top-level
 * `name` of a JSON call or list of calls (Hermes, Phi-4, Mistral, Llama 3.1), or `NAME.call(` /
 * `NAME[ARGS]` (Llama's python tag, Mistral v11). A name inside a call's arguments is not one.
 */
export function markupCallNames(span: string): string[] {
  const named = /^<function=([^>\s]+)>/.exec(span) ?? /\bto=(?:functions\.)?([^\s<]+)/.exec(span);
  if (named) return [named[1]!];
  const sections = [...span.matchAll(/functions\.([\w.-]+):\d+|<｜tool▁sep｜>([^\n<｜]+)/g)].map((m) => (m[1] ?? m[2]!).trim());
  if (sections.length > 0) return sections;
  const marker = MARKERS.find((m) => span.startsWith(m.open));
  let body = marker ? span.slice(marker.open.length) : span;
  if (marker?.close && body.endsWith(marker.close)) body = body.slice(0, -marker.close.length);
  body = body.trim();
  try {
    const parsed: unknown = JSON.parse(body);
    const names = (Array.isArray(parsed) ? parsed : [parsed]).flatMap((c: unknown) =>
      c !== null && typeof c === 'object' && typeof (c as { name?: unknown }).name === 'string' ? [(c as { name: string }).name] : [],
    );
    if (names.length > 0) return names;
  } catch {
    // not JSON: the call forms below
  }
  const call = /^([A-Za-z_][\w.-]*?)(?:\.call)?\s*[[(]/.exec(body);
  if (call) return [call[1]!];
  const first = /"name"\s*:\s*"([^"\\]{1,128})"/.exec(body);
  return first ? [first[1]!] : [];
}

function earliestOpen(s: string): { at: number; marker: Marker } | null {
  let best: { at: number; marker: Marker } | null = null;
  for (const marker of MARKERS) {
    const at = s.indexOf(marker.open);
    if (at >= 0 && (best === null || at < best.at)) best = { at, marker };
  }
  return best;
}

/**
 * Length of the longest tail of `s` that is a proper prefix of some opening tag. Every tag opens
 * with `<` or `[`: only tails that start with one are tried.
 */
function partialOpenLength(s: string): number {
  for (let at = Math.max(0, s.length - (LONGEST_OPEN - 1)); at < s.length; at++) {
    const c = s.charCodeAt(at);
    if (c !== 0x3c && c !== 0x5b) continue;
    const tail = s.slice(at);
    if (MARKERS.some((m) => m.open.length > tail.length && m.open.startsWith(tail))) return tail.length;
  }
  return 0;
}
