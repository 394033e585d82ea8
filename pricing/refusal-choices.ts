// The money refusals (402, SPEC §6 and §11): message with exact figures, the figures as numbers, and
// the three choices — raise the limit, use a cheaper model, or stop. The route puts these in the
// OpenAI envelope (`details` sit beside message/type/param/code) with `x-should-retry: false`.

import type { CheaperModel, LimitScope } from './cheaper-models.js';
import { roundUsd } from './model-price.js';
import { raiseTo, raiseToForConversation, raiseToForMonthly } from './raise-to.js';
import { formatUsdText } from './usd-format.js';

export interface RefusalChoices {
  /** Null where no limit a client could ask for would admit the request (`model_not_priced`). */
  raise_to_usd: number | null;
  cheaper_models: CheaperModel[];
  /** Nothing happens by itself: the request stays unanswered until someone chooses. */
  stop: true;
}

export type MoneyRefusalCode = 'conversation_cap_reached' | 'monthly_budget_reached' | 'model_not_priced';

export interface MoneyRefusal {
  status: 402;
  code: MoneyRefusalCode;
  message: string;
  /** The request field the error is about (OpenAI envelope `param`), or null. */
  param: string | null;
  details: Record<string, unknown>;
}

export interface MoneyRefusalInput {
  scope: LimitScope;
  /** Settled spend against the limit. */
  spentUsd: number;
  /** Reserved by requests still in flight (default 0): counted against the limit, not yet spent. */
  reservedUsd?: number;
  limitUsd: number;
  /** The request's worst case; null when its cost is unknown (a metered model without a price). */
  neededUsd: number | null;
  /** Room past the cap the request had, on a cheaper model (ADR 0006). */
  roomUsd?: number;
  cheaperModels: CheaperModel[];
}

/**
 * `raise_to_usd`, as SPEC §6 has it: twice a cap or half again a month's budget, on the ladder —
 * whether or not that admits this very request (`limitToAdmit` says what would, ADR 0006). A limit
 * of $0 has no multiple to offer: there, the raise is the one that admits the request.
 */
export function raiseToFor(scope: LimitScope, limitUsd: number, spentUsd: number, neededUsd: number): number {
  if (limitUsd <= 0) return limitToAdmit(spentUsd, neededUsd);
  return scope === 'monthly' ? raiseToForMonthly(limitUsd) : raiseToForConversation(limitUsd);
}

/**
 * The least limit on the same ladder that would admit this request now: what is spent and held,
 * plus what it needs, less the room past the cap a cheaper model has (ADR 0006).
 */
export function limitToAdmit(committedUsd: number, neededUsd: number, roomUsd = 0): number {
  return raiseTo(committedUsd + neededUsd - roomUsd);
}

export function refusalChoices(input: MoneyRefusalInput): RefusalChoices {
  return {
    raise_to_usd: raiseToFor(input.scope, input.limitUsd, input.spentUsd + (input.reservedUsd ?? 0), input.neededUsd ?? 0),
    cheaper_models: input.cheaperModels,
    stop: true,
  };
}

const LIMIT_NAME: Record<LimitScope, { reached: string; whole: string }> = {
  conversation: { reached: 'conversation cap reached', whole: 'the whole conversation cap' },
  parent: { reached: 'parent conversation cap reached', whole: "the whole parent conversation's cap" },
  monthly: { reached: 'monthly budget reached', whole: 'the whole monthly budget' },
};

/**
 * The figures of one message, each as `$1.84` — with more decimals where two would make different
 * figures read alike ("needs up to $0.03, more than the cap of $0.03" for $0.034 against $0.025).
 */
function figuresText(...usd: number[]): string[] {
  const differ = (a: number, b: number, f: (x: number) => string) => a === b || f(a) !== f(b);
  let format = formatUsdText;
  for (let decimals = 3; decimals <= 8; decimals++) {
    if (usd.every((a) => usd.every((b) => differ(a, b, format)))) break;
    const d = decimals;
    // A figure that is not zero is never shown as one: it keeps its own significant digits.
    format = (x) => (x !== 0 && Number(x.toFixed(d)) === 0 ? formatUsdText(x) : `$${x.toFixed(d)}`);
  }
  return usd.map(format);
}

/**
 * The sentence a person reads: which limit, what was spent of it, what this request needs. `room`:
 * what a cheaper model had past the cap (ADR 0006), said beside the cap.
 */
export function moneyRefusalMessage(scope: LimitScope, spentUsd: number, limitUsd: number, neededUsd: number | null, reservedUsd = 0, roomUsd = 0): string {
  const name = LIMIT_NAME[scope];
  const month = scope === 'monthly' ? ' this month' : '';
  // A request larger than the whole limit could never pass, however little was spent: say so.
  if (neededUsd !== null && neededUsd > limitUsd + roomUsd) {
    const [needs, limit, room] = figuresText(neededUsd, limitUsd, roomUsd);
    const withRoom = roomUsd > 0 ? ` and the ${room} of room a cheaper model has past it` : '';
    return `${name.reached}: this request needs up to ${needs}, more than ${name.whole} of ${limit}${withRoom}`;
  }
  // Only the figures said are formatted together (a figure not said must not add decimals).
  const said = [spentUsd, limitUsd, ...(neededUsd === null ? [] : [neededUsd]), ...(reservedUsd > 0 ? [reservedUsd] : []), ...(roomUsd > 0 ? [roomUsd] : [])];
  const text = figuresText(...said);
  let next = 2;
  const [spent, limit] = text;
  const needs = neededUsd === null ? '' : text[next++];
  const held = reservedUsd > 0 ? text[next++] : '';
  const room = roomUsd > 0 ? text[next++] : '';
  const withRoom = roomUsd > 0 ? ` (and ${room} of room past it for a cheaper model)` : '';
  // Requests still running hold part of the limit: said apart from what was spent.
  const holding = reservedUsd > 0 ? ` and ${held} is held by requests still running` : '';
  // Nothing bounds what an unpriced request would cost, and nothing of the limit is left for it.
  const asks =
    neededUsd === null
      ? ", and this request's model has no price, so its cost is unknown and it starts only while the limit has room"
      : `, this request needs up to ${needs}`;
  return `${name.reached}: spent ${spent} of ${limit}${withRoom}${month}${holding}${asks}`;
}

/** `conversation_cap_reached` (own or parent's cap) or `monthly_budget_reached`, 402. */
export function moneyRefusal(input: MoneyRefusalInput): MoneyRefusal {
  const { scope, spentUsd, limitUsd, neededUsd } = input;
  const reservedUsd = input.reservedUsd ?? 0;
  return {
    status: 402,
    code: scope === 'monthly' ? 'monthly_budget_reached' : 'conversation_cap_reached',
    message: moneyRefusalMessage(scope, spentUsd, limitUsd, neededUsd, reservedUsd, input.roomUsd ?? 0),
    param: null,
    details: {
      scope,
      spent_usd: roundUsd(spentUsd),
      reserved_usd: roundUsd(reservedUsd),
      limit_usd: roundUsd(limitUsd),
      needed_usd: neededUsd === null ? null : roundUsd(neededUsd),
      // The same figures under the names SPEC §6 gives them: spent, cap (or budget), needed — USD.
      spent: roundUsd(spentUsd),
      [scope === 'monthly' ? 'budget' : 'cap']: roundUsd(limitUsd),
      needed: neededUsd === null ? null : roundUsd(neededUsd),
      // Twice the cap may not be enough for a request larger than it: the least limit, on the
      // same ladder, that would admit this one now (unknown for an unpriced model).
      limit_to_admit_usd: neededUsd === null ? null : limitToAdmit(spentUsd + reservedUsd, neededUsd, input.roomUsd ?? 0),
      choices: refusalChoices(input),
    },
  };
}

/**
 * `model_not_priced` (402): a metered model without a price while a money limit applies. Counting
 * it as $0 would let it spend past every limit unseen, so it is refused unless the operator
 * chose `"unpriced": "allow"` (SPEC §7).
 */
export function modelNotPriced(model: string, cheaperModels: CheaperModel[] = []): MoneyRefusal {
  // A 402 for money like the others (SPEC §6, §11), with its choices: a higher limit admits nothing
  // here (no limit can hold a cost no one knows), so there is no raise to offer; the models that
  // spend no money are admitted at any money limit; or stop.
  const choices: RefusalChoices = { raise_to_usd: null, cheaper_models: cheaperModels, stop: true };
  return {
    status: 402,
    code: 'model_not_priced',
    message: `no price for model "${model}": add it to the price overrides file (prices.overrides) or set prices.unpriced to "allow"`,
    param: 'model',
    details: { model, choices },
  };
}
