// Zilloft (Zillow clone) milestones: search → filters → a listing's page.
//
// Client-state evidence (REAL `/finish` JSON, the structure the v2 zilloft verifiers read):
//   - tour requests: `differences.requestTours.added` and `initialfinaldiff.added.tourRequests.requestTourList`
//     (entries with `requestTourData.{formValues,options}`);
//   - agent contacts: `differences.contactAgents.added` and `initialfinaldiff.added.tourRequests.contactAgentList`
//     (entries with `contactAgentData.formValues`);
//   - search and filter values: the verifiers do not name a slice; they scan the whole state for keys such
//     as `location`/`search`/`query` and `maxPrice`/`minBedrooms`. We scan only what the episode changed
//     (`initialfinaldiff.{added,updated}`), skipping `config`, `router`, `tourRequests`, `savedHomes`.
// A tour request or an agent contact proves a listing was open, so listing_viewed fires with it.

import {
  changedSubtrees,
  defineDetector,
  describeNode,
  FIELD_ROLES,
  findNode,
  getPath,
  hasFlag,
  isRecord,
  itemsOf,
  MESSAGE_ROLES,
  meaningful,
  nonEmpty,
  oneLine,
  pathEvidence,
  queryEvidence,
  quote,
  routerPath,
  walk,
  type AxNode,
  type MilestoneDetector,
  type Page,
} from '../milestones';

const SKIP_SLICES = ['config', 'router', 'tourRequests', 'savedHomes', 'user', 'auth', 'ui'];

function requestOrContact(state: unknown): string | null {
  const sources: Array<[string[], string]> = [
    [['differences', 'requestTours', 'added'], 'tour request'],
    [['initialfinaldiff', 'added', 'tourRequests', 'requestTourList'], 'tour request'],
    [['differences', 'contactAgents', 'added'], 'agent contact'],
    [['initialfinaldiff', 'added', 'tourRequests', 'contactAgentList'], 'agent contact'],
  ];
  for (const [path, what] of sources) {
    const entry = itemsOf(getPath(state, path)).find((e) => isRecord(e) && (isRecord(e.requestTourData) || isRecord(e.contactAgentData)));
    if (entry) return `state: ${what} in ${path.join('.')}`;
  }
  return null;
}

// Search: a submitted location or query. Keys that only hold typed text or suggestions do not count.
const SEARCH_KEY = /search|query|location|city|region|keyword|term/i;
const NOT_SEARCH_KEY = /input|typed|draft|suggest|autocomplete|recent|history|pathname|saved/i;
const SEARCH_PATH = /\/(search|for[-_]?sale|results)(\/|$)/i;
const SEARCH_PARAM = /^(q|query|search|searchquery|search_query|searchterm|term|location|city|region|area|citystatezip)$/i;
const RESULTS_TEXT = /\b\d[\d,]*\s+(homes|results|listings|properties|houses)\b|\bhomes?\s+for\s+sale\s+in\b|\bresults\s+for\b|^real\s+estate\s+(&|and)\s+homes\s+for\s+sale\b/i;

// Filters: bounded price/beds/baths/size values.
const FILTER_KEY =
  /(min|max)[_-]?(price|beds?|bedrooms?|baths?|bathrooms?|sqft|size|area|lot)|(price|beds?|bedrooms?|baths?|bathrooms?|sqft|size|area|lot)[_-]?(min|max|range|from|to|low|high)/i;
const FILTER_FIELD = /price|beds?\b|bedrooms?|baths?\b|bathrooms?|sq\.?\s*ft|sqft|square\s+feet|home\s+type|property\s+type|lot\s+size|year\s+built/i;
const FILTER_PARAM = /price|beds?|bedrooms?|baths?|bathrooms?|sqft|home_?type|property_?type|^(min|max)/i;
// A filter button's summary once a value is chosen: "Under $500K", "$300K - $500K", "3+ bd", "2+ ba".
const FILTER_SUMMARY = /^(under|over|below|above)\s+\$|\$\s?\d[\d,.]*\s*[km]?\+?\s*(-|–|to)\s*\$?\s?\d|^\d\+$|\b\d\+\s*(bd|bds|beds?|bedrooms?|ba|baths?|bathrooms?)\b/i;
// A chosen option's own name: "3+", "$500K", "2 ba".
const CHOICE_VALUE = /^\$?\s?\d[\d,.]*\s*[km]?\+?(\s*(bd|bds|beds?|bedrooms?|ba|baths?|bathrooms?))?$/i;
const CHOICE_ROLES = new Set(['button', 'radio', 'option', 'checkbox', 'menuitemradio', 'menuitemcheckbox', 'tab', 'combobox']);

const LISTING_PATH = /\/(homedetails|home[-_]details|listing|property|properties|house|houses)\/[^/]+|\/homes?\/[\w-]*\d[\w-]*(\/|$)/i;
const LISTING_PARAM = /^(zpid|listingid|listing_id|homeid|home_id|propertyid|property_id)$/i;
const LISTING_BUTTON = /^(request\s+(a\s+)?tour|schedule\s+(a\s+)?tour|tour\s+(this|the)\s+home|contact\s+(an?\s+|the\s+)?agent|ask\s+a\s+question)$/i;

function filterControlChanged(view: Page, prev: Page): string | null {
  // A price/beds/baths control whose value differs from its value on the previous page.
  const before = new Map<string, string>();
  for (const n of prev.nodes) if (n.value !== null && FILTER_FIELD.test(n.name)) before.set(`${n.role}|${n.name}`, n.value);
  for (const n of view.nodes) {
    if (n.value === null || !(FIELD_ROLES.has(n.role) || n.role === 'slider') || !FILTER_FIELD.test(n.name)) continue;
    const old = before.get(`${n.role}|${n.name}`);
    if (old !== undefined && old !== n.value && meaningful(n.value)) return `${describeNode(n)} (was ${quote(old)})`;
  }
  // An option ("3+", "$500K", "Under $500K") that became checked/selected. Options merely shown (a dropdown
  // opened) are not evidence.
  const chosen = (n: AxNode): boolean => hasFlag(n, 'checked') || hasFlag(n, 'selected') || hasFlag(n, 'pressed');
  const prevChosen = new Set<string>();
  for (const n of prev.nodes) if (CHOICE_ROLES.has(n.role) && chosen(n)) prevChosen.add(`${n.role}|${n.name}`);
  for (const n of view.nodes) {
    if (!CHOICE_ROLES.has(n.role) || !chosen(n) || prevChosen.has(`${n.role}|${n.name}`)) continue;
    const name = n.name.trim();
    if (FILTER_SUMMARY.test(name) || CHOICE_VALUE.test(name)) return describeNode(n);
  }
  // A filter button renamed to its summary (the same element: "Beds & Baths" → "3+ bd, 2+ ba").
  const prevById = new Map<number, AxNode>();
  for (const n of prev.nodes) prevById.set(n.id, n);
  for (const n of view.nodes) {
    if (n.role !== 'button' && n.role !== 'combobox' && n.role !== 'tab') continue;
    const old = prevById.get(n.id);
    if (old && old.role === n.role && old.name !== n.name && FILTER_SUMMARY.test(n.name.trim())) return `${describeNode(n)} (was ${quote(old.name)})`;
  }
  return null;
}

export const zilloftMilestones: MilestoneDetector[] = [
  // A search ran: a results URL (`/search`, `/for_sale`, `/results`, or ?searchQuery=/?location=...), a
  // results line ("24 homes", "Homes for sale in Boston"), or a changed search/location/query key in the
  // state diff. Typing a place into the search box without submitting is not evidence.
  defineDetector('search_performed', 'url /search|/for_sale|?location=, or text "24 homes"/"Homes for sale in"; state: a changed search/location key', (view) => {
    const url = pathEvidence(view, SEARCH_PATH) ?? queryEvidence(view, SEARCH_PARAM);
    if (url) return url;
    const text = findNode(view, (n) => MESSAGE_ROLES.has(n.role) && RESULTS_TEXT.test(n.name.trim()));
    if (text) return describeNode(text);
    for (const { section, tree } of changedSubtrees(view.state)) {
      const hit = walk(
        tree,
        (e) => (SEARCH_KEY.test(e.key) && !NOT_SEARCH_KEY.test(e.key) && typeof e.value === 'string' && nonEmpty(e.value) ? `${e.path.join('.')} = ${quote(e.value)}` : null),
        SKIP_SLICES,
      );
      if (hit) return `state: ${section}.${hit}`;
    }
    return null;
  }),

  // A price/beds/baths/size filter is set: URL parameters (?maxPrice=, ?beds=), a filter control whose value
  // changed, an option ("3+", "$500K") that became checked/selected, a filter button renamed to its summary
  // ("Beds & Baths" → "3+ bd, 2+ ba"; same element id), or a
  // min/max price/beds key (or any price/beds key under a "filter" slice) with a real value in the state
  // diff. "Any"/"No max"/0 do not count.
  defineDetector('filters_applied', 'url ?maxPrice=/?beds=, a changed Price/Beds control or "3+ bd" summary; state: min/max price/beds key set', (view, prev) => {
    const url = queryEvidence(view, FILTER_PARAM, meaningful);
    if (url) return url;
    const ui = filterControlChanged(view, prev);
    if (ui) return ui;
    for (const { section, tree } of changedSubtrees(view.state)) {
      const hit = walk(
        tree,
        (e) => {
          if (!meaningful(e.value) || (e.value !== null && typeof e.value === 'object' && !Array.isArray(e.value))) return null;
          const underFilter = e.path.slice(0, -1).some((k) => /filter/i.test(k));
          const ok = FILTER_KEY.test(e.key) || (underFilter && /price|bed|bath|sqft|size|type|area|lot/i.test(e.key));
          return ok ? `${e.path.join('.')} = ${quote(e.value)}` : null;
        },
        SKIP_SLICES,
      );
      if (hit) return `state: ${section}.${hit}`;
    }
    return null;
  }),

  // A listing's page: URL `/homedetails/<id>`, `/property/<id>`, `/homes/<id>` or ?zpid=, same in the router
  // state, or a "Request a tour" / "Contact agent" button; state: a tour request or agent contact.
  defineDetector(
    'listing_viewed',
    'url /homedetails/<id>|/property/<id>|?zpid= (or router pathname), "Request a tour"/"Contact agent" button; state: tour request/contact',
    (view) => {
      const url = pathEvidence(view, LISTING_PATH) ?? queryEvidence(view, LISTING_PARAM);
      if (url) return url;
      const rp = routerPath(view.state);
      if (rp && LISTING_PATH.test(rp)) return `state: router.location.pathname ${oneLine(rp, 80)}`;
      const b = findNode(view, (n) => (n.role === 'button' || n.role === 'link') && LISTING_BUTTON.test(n.name.trim()));
      if (b) return describeNode(b);
      return requestOrContact(view.state);
    },
  ),
];
